//! Dump tree discovery. (Being written.)
