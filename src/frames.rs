//! Polars frames. (Being written.)
