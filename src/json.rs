//! Lenient JSON as Python's `json.dump` writes it (bare NaN/Infinity). (Being written.)
