//! Inspector. (Being written.)
