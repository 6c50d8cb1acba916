//! Pure comparison building blocks for `dumpdiff`: metrics of one aligned pair, the
//! tolerances it is judged against, and the row/position alignment that pairs elements.

pub mod align;
pub mod metrics;
pub mod propagate;
pub mod tolerance;
