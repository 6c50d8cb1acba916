//! Text training logs line by line (verl console, TRL dicts, mlx, nanoGPT, micro lines)
//! through the assembler that attaches micro lines and warnings to steps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlforensics::logs::textlog::{parse_text_line, TextAssembler};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut asm = TextAssembler::new(0);
    for (i, line) in text.lines().enumerate() {
        asm.push(i as u64 + 1, parse_text_line(line));
    }
    asm.finish();
});
