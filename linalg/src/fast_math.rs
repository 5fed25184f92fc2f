//! Element-wise functions written so that loops over slices of them vectorise.

/// `exp(x)` in f32, branch-free so that loops over slices of it vectorise (`f32::exp` is a libm
/// call per element: it was half of VICReg-exp's log-sum-exp and of GELU's `Φ`). Cody–Waite reduction `x = n·ln 2 + r`,
/// |r| ≤ ln 2 / 2, Cephes' polynomial for `eʳ`, and `2ⁿ` applied as two normal powers of two so
/// overflow gives +∞ and underflow gradual denormals then 0, as `f32::exp` does; NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    let x = x.clamp(-104.0, 89.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // The integer n sits in the low mantissa bits of `shifted` (a float-to-int cast would be
    // scalarised).
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let e_r = p * r * r + r + 1.0;
    let power_of_two = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let half = n_int >> 1;
    e_r * power_of_two(half) * power_of_two(n_int - half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_f64_exp_to_a_few_ulp() {
        let mut worst_ulps = 0.0f64;
        for step in 0..2_000_000 {
            let x = -103.0 + step as f32 * 1e-4 * 1.91;
            let (ours, exact) = (exp_f32(x) as f64, (x as f64).exp());
            if exact > f32::MAX as f64 {
                assert_eq!(ours, f64::INFINITY, "exp({x})");
            } else if exact >= f32::MIN_POSITIVE as f64 {
                let ulp = (exact as f32).to_bits();
                let ulp = (f32::from_bits(ulp + 1) - f32::from_bits(ulp)) as f64;
                worst_ulps = worst_ulps.max((ours - exact).abs() / ulp);
            } else {
                assert!(
                    (ours - exact).abs() <= 2.0 * f32::from_bits(1) as f64,
                    "exp({x})"
                );
            }
        }
        assert!(worst_ulps <= 2.0, "{worst_ulps} ulp");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }
}
