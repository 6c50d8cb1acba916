//! Every entry point against the std function, bit for bit: seeded random inputs in the
//! ranges the metric loops feed (and well beyond), random bit patterns, each branch
//! threshold and its neighbours, specials, and slices of every remainder length.

use super::*;

/// splitmix64: deterministic inputs without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a domain draws its inputs.
#[derive(Clone, Copy)]
enum Gen {
    /// Uniform in [lo, hi).
    Uniform(f64, f64),
    /// Log-uniform in [lo, hi) (0 < lo < hi), of a random sign when the flag is set.
    LogUniform(f64, f64, bool),
    /// `exp` of a uniform value in [lo, hi) (ratios of probabilities).
    ExpOf(f64, f64),
    /// Any 64-bit pattern (NaN payloads, subnormals, infinities, both signs).
    Bits,
}

impl Gen {
    fn draw(self, rng: &mut Rng) -> f64 {
        match self {
            Gen::Uniform(lo, hi) => lo + (hi - lo) * rng.uniform(),
            Gen::LogUniform(lo, hi, signed) => {
                let v = (lo.ln() + (hi.ln() - lo.ln()) * rng.uniform()).exp();
                if signed && rng.next() & 1 == 1 {
                    -v
                } else {
                    v
                }
            }
            Gen::ExpOf(lo, hi) => (lo + (hi - lo) * rng.uniform()).exp(),
            Gen::Bits => f64::from_bits(rng.next()),
        }
    }
}

/// The input domains of each function: those of the metric loops (see the brief in the
/// module doc), each branch's neighbourhood, and wide ranges mostly on the scalar path.
fn domains(f: Func) -> Vec<(&'static str, Gen)> {
    let tiny = 2f64.powi(-60);
    match f {
        Func::Exp => vec![
            ("log-prob differences |x| < 1", Gen::Uniform(-1.0, 1.0)),
            ("differences |x| < 20", Gen::Uniform(-20.0, 20.0)),
            ("log-probs -30..0", Gen::Uniform(-30.0, 0.0)),
            (
                "tiny 2^-60..2^-40, signed",
                Gen::LogUniform(tiny, 2f64.powi(-40), true),
            ),
            ("wide -800..800", Gen::Uniform(-800.0, 800.0)),
            ("random bits", Gen::Bits),
        ],
        Func::ExpM1 => vec![
            ("tolerances 1e-8..1e-1", Gen::LogUniform(1e-8, 1e-1, false)),
            ("signed |x| < 0.1", Gen::Uniform(-0.1, 0.1)),
            ("2^-60..0.35, signed", Gen::LogUniform(tiny, 0.35, true)),
            ("wide -50..50", Gen::Uniform(-50.0, 50.0)),
            ("random bits", Gen::Bits),
        ],
        Func::Ln => vec![
            ("ratios 0.5..2", Gen::Uniform(0.5, 2.0)),
            ("close to 1: 1 ± 1/16", Gen::Uniform(0.9375, 1.0625)),
            ("ratios 0.9..1.1", Gen::Uniform(0.9, 1.1)),
            ("exp(d), |d| < 1", Gen::ExpOf(-1.0, 1.0)),
            ("1e-300..1e300", Gen::LogUniform(1e-300, 1e300, false)),
            ("random bits", Gen::Bits),
        ],
        Func::Ln1p => vec![
            ("tolerances 1e-8..1e-1", Gen::LogUniform(1e-8, 1e-1, false)),
            ("signed |x| < 0.3", Gen::Uniform(-0.3, 0.3)),
            ("2^-60..0.42, signed", Gen::LogUniform(tiny, 0.42, true)),
            ("wide -1..10", Gen::Uniform(-1.0, 10.0)),
            ("random bits", Gen::Bits),
        ],
    }
}

/// The kernels wherever they are meant to match (AVX2+FMA, glibc 2.36), probe or not: a
/// kernel's error then shows here with its input (through [`VecMath::get`] the probe
/// would switch the kernel off and the comparison pass on the std function).
fn kernels() -> VecMath {
    VecMath {
        simd: [cpu_has_avx2_fma() && libc_is_glibc_2_36(); 4],
    }
}

/// `vm` on a copy of `xs` against the std function on each element: panics at the first
/// difference in bits.
fn check(vm: VecMath, f: Func, xs: &[f64]) {
    let mut ys = xs.to_vec();
    vm.apply(f, &mut ys);
    let g = f.scalar();
    for (&x, &y) in xs.iter().zip(&ys) {
        let want = g(x);
        assert_eq!(
            y.to_bits(),
            want.to_bits(),
            "{f:?}({x:e} = {:#018x}): got {y:e} ({:#018x}), want {want:e} ({:#018x})",
            x.to_bits(),
            y.to_bits(),
            want.to_bits(),
        );
    }
}

/// `n` inputs of each of `f`'s domains, checked in slices of 4096 (and a ragged last one).
fn check_domains(f: Func, n: usize, seed: u64) {
    let vm = kernels();
    for (i, (_, gen)) in domains(f).into_iter().enumerate() {
        let mut rng = Rng(seed ^ ((i as u64) << 32) ^ f as u64);
        let mut left = n;
        while left > 0 {
            let len = left.min(4096 + 3);
            let xs: Vec<f64> = (0..len).map(|_| gen.draw(&mut rng)).collect();
            check(vm, f, &xs);
            left -= len;
        }
    }
}

#[test]
fn simd_is_taken_where_glibc_and_the_cpu_allow() {
    let vm = VecMath::get();
    // On x86-64 with AVX2+FMA and glibc 2.36 (this machine) every kernel passes its
    // probe; the other tests check the kernels themselves ([`kernels`]) there.
    if cfg!(target_arch = "x86_64") && cpu_has_avx2_fma() && libc_is_glibc_2_36() {
        for f in Func::ALL {
            assert!(vm.simd(f), "{f:?} fell back to scalar");
        }
    }
    if !cpu_has_avx2_fma() || !libc_is_glibc_2_36() {
        assert_eq!(vm, VecMath::SCALAR);
    }
}

#[test]
fn exp_domains() {
    check_domains(Func::Exp, 1_000_000, 1);
}

#[test]
fn exp_m1_domains() {
    check_domains(Func::ExpM1, 1_000_000, 2);
}

#[test]
fn ln_domains() {
    check_domains(Func::Ln, 1_000_000, 3);
}

#[test]
fn ln_1p_domains() {
    check_domains(Func::Ln1p, 1_000_000, 4);
}

/// Steps of `ulps` representable values from `x` (towards +inf in bits for positive ulps).
fn step(x: f64, ulps: i64) -> f64 {
    f64::from_bits(x.to_bits().wrapping_add_signed(ulps))
}

#[test]
fn thresholds_neighbours_and_specials() {
    let vm = kernels();
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        f64::MIN_POSITIVE,
        -f64::MIN_POSITIVE,
        f64::from_bits(1),
        f64::from_bits(0x000f_ffff_ffff_ffff),
        -f64::from_bits(1),
        1e-310,
        -1e-310,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::from_bits(0xfff4_0000_0000_0001),
        std::f64::consts::LN_2 * 0.5,
        std::f64::consts::LN_2 * 1.5,
        709.78,
        -745.13,
        -0.2929,
        0.41422,
    ];
    for f in Func::ALL {
        let mut xs: Vec<f64> = specials.to_vec();
        // Each threshold's neighbours, 40 steps either side, of both signs.
        for &t in thresholds(f) {
            for sign in [1.0, -1.0] {
                let x = sign * f64::from_bits(t << 32);
                xs.extend((-40..=40).map(|d| step(x, d)));
            }
        }
        // Every table subinterval's start (ln) and every exp table slot's centre and edges.
        for j in 0..256u64 {
            xs.push(f64::from_bits(0x3fe6_0000_0000_0000 + (j << 45)));
            let k = j as f64 - 128.0;
            for d in [-0.5, 0.0, 0.5] {
                xs.push((k + d) * std::f64::consts::LN_2 / 128.0);
            }
        }
        // 1 ± a few ulps (ln's x == 1 case and the window's centre).
        xs.extend((-64..=64).map(|d| step(1.0, d)));
        // Powers of two across the exponent range, and their neighbours.
        for e in -1074..=1023 {
            let p = 2f64.powi(e);
            xs.extend([p, -p, step(p, 1), step(p, -1), -step(p, 1)]);
        }
        xs.extend(probes(f));
        // Every lane position: the same values shifted by 0..4 places.
        for shift in 0..4 {
            check(vm, f, &xs[shift..]);
        }
    }
}

#[test]
fn every_remainder_length() {
    let vm = kernels();
    let mut rng = Rng(5);
    for f in Func::ALL {
        let gens: Vec<Gen> = domains(f).into_iter().map(|(_, g)| g).collect();
        let pool: Vec<f64> = (0..64)
            .map(|i| gens[i % gens.len()].draw(&mut rng))
            .collect();
        for len in 0..=9 {
            for start in 0..8 {
                check(vm, f, &pool[start..start + len]);
            }
        }
        // The in-place entry points themselves, on every length.
        for len in 0..=9 {
            let xs = &pool[..len];
            let mut ys = xs.to_vec();
            match f {
                Func::Exp => vm.exp_in_place(&mut ys),
                Func::ExpM1 => vm.exp_m1_in_place(&mut ys),
                Func::Ln => vm.ln_in_place(&mut ys),
                Func::Ln1p => vm.ln_1p_in_place(&mut ys),
            }
            let g = f.scalar();
            for (x, y) in xs.iter().zip(&ys) {
                assert_eq!(y.to_bits(), g(*x).to_bits(), "{f:?}({x:e}), len {len}");
            }
        }
    }
}

#[test]
fn ln_every_mix_of_a_block() {
    // `ln_slice` picks a loop per block of LN_BLOCK by how many lanes are close to 1: every
    // count from none to all, at random places, beside table-path values and specials,
    // in slices one block long, ragged, and several blocks long.
    let vm = kernels();
    let mut rng = Rng(8);
    let near = Gen::Uniform(0.9375, 1.0625);
    let far = Gen::LogUniform(1e-300, 1e300, false);
    let specials = [1.0, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e-310];
    for len in [61, 64, 67, 64 * 3 + 2] {
        for k in 0..=len {
            let mut xs: Vec<f64> = (0..len)
                .map(|i| {
                    if i < k {
                        near.draw(&mut rng)
                    } else {
                        far.draw(&mut rng)
                    }
                })
                .collect();
            // Shuffle (Fisher–Yates), then a special at one random place.
            for i in (1..len).rev() {
                xs.swap(i, rng.next() as usize % (i + 1));
            }
            if k % 3 == 0 {
                let s = specials[rng.next() as usize % specials.len()];
                xs[rng.next() as usize % len] = s;
            }
            check(vm, Func::Ln, &xs);
        }
    }
}

#[test]
fn scalar_fallback_is_the_std_function() {
    let mut rng = Rng(6);
    for f in Func::ALL {
        let xs: Vec<f64> = (0..1000).map(|_| Gen::Bits.draw(&mut rng)).collect();
        check(VecMath::SCALAR, f, &xs);
    }
}

/// `VMATH_BIG_N` (default 25 M) inputs per domain per function, checked; the counts
/// printed. A one-off run in release mode: `cargo test --release --lib compare::vmath --
/// --ignored --nocapture big_check`.
#[test]
#[ignore]
fn big_check() {
    let n: usize = std::env::var("VMATH_BIG_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25_000_000);
    let vm = VecMath::get();
    for f in Func::ALL {
        assert!(vm.simd(f) || vm == VecMath::SCALAR, "{f:?} alone is scalar");
        let g = f.scalar();
        let mut total = 0usize;
        for (i, (name, gen)) in domains(f).into_iter().enumerate() {
            let mut rng = Rng(0xb16 ^ ((i as u64) << 32) ^ ((f as u64) << 40));
            let (mut done, mut bad) = (0usize, 0usize);
            let mut xs = vec![0.0; 1 << 16];
            let mut ys = xs.clone();
            while done < n {
                let len = (n - done).min(xs.len());
                for x in &mut xs[..len] {
                    *x = gen.draw(&mut rng);
                }
                ys[..len].copy_from_slice(&xs[..len]);
                vm.apply(f, &mut ys[..len]);
                for (x, y) in xs[..len].iter().zip(&ys[..len]) {
                    if y.to_bits() != g(*x).to_bits() {
                        bad += 1;
                        if bad <= 5 {
                            eprintln!("MISMATCH {f:?}({x:e} = {:#018x})", x.to_bits());
                        }
                    }
                }
                done += len;
            }
            total += done;
            println!("big_check {f:?} [{name}]: {done} inputs, {bad} mismatches");
            assert_eq!(bad, 0);
        }
        // Consecutive doubles across each branch threshold: 2^20 of them centred on it.
        let (mut done, mut bad) = (0usize, 0usize);
        for &t in thresholds(f) {
            for sign in [0, 1u64 << 63] {
                let start = ((t << 32) | sign) - (1 << 19);
                let xs: Vec<f64> = (0..1u64 << 20).map(|d| f64::from_bits(start + d)).collect();
                let mut ys = xs.clone();
                vm.apply(f, &mut ys);
                for (x, y) in xs.iter().zip(&ys) {
                    if y.to_bits() != g(*x).to_bits() {
                        bad += 1;
                        if bad <= 5 {
                            eprintln!("MISMATCH {f:?}({x:e} = {:#018x})", x.to_bits());
                        }
                    }
                }
                done += xs.len();
            }
        }
        total += done;
        println!("big_check {f:?} [threshold sweeps]: {done} inputs, {bad} mismatches");
        assert_eq!(bad, 0);
        println!("big_check {f:?}: {total} inputs in all, 0 mismatches");
    }
}

/// ns/element of the std scalar calls and of [`VecMath::get`] over 1 M-element slices of
/// each domain (best of 5). Release mode: `cargo test --release --lib compare::vmath --
/// --ignored --nocapture speed`.
#[test]
#[ignore]
fn speed() {
    use std::time::Instant;
    let n = 1 << 20;
    let vm = VecMath::get();
    for f in Func::ALL {
        for (name, gen) in domains(f) {
            let mut rng = Rng(7);
            let xs: Vec<f64> = (0..n).map(|_| gen.draw(&mut rng)).collect();
            let mut ys = xs.clone();
            let mut time = |vm: VecMath| {
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    ys.copy_from_slice(&xs);
                    let t = Instant::now();
                    vm.apply(f, std::hint::black_box(&mut ys));
                    best = best.min(t.elapsed().as_secs_f64());
                }
                best * 1e9 / n as f64
            };
            let (scalar, simd) = (time(VecMath::SCALAR), time(vm));
            println!(
                "speed {f:?} [{name}]: scalar {scalar:.2} ns, simd {simd:.2} ns, {:.2}x",
                scalar / simd
            );
        }
    }
}
