//! Summaries of repeated measurements: the median and the spread a table prints.

/// The median of `v` (the upper middle for an even count); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// The `p`th percentile (0–100) of `v`, nearest rank; 0 for none.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[i.clamp(1, s.len()) - 1]
}

/// The smallest and largest of `v`.
pub fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// The mean of `v` and its standard error (the sample standard deviation over the square
/// root of the count); 0 and 0 for none, the value and 0 for one.
pub fn mean_and_se(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// `a / b`, or `None` when `b` is not a positive number.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_percentiles_pick_the_right_element_whatever_the_order() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[]), 0.0);
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(range(&[2.0, 5.0, 1.0]), (1.0, 5.0));
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
    }

    #[test]
    fn the_standard_error_is_the_sample_deviation_over_the_root_of_the_count() {
        // Deviations -2, 0, 2: sample variance 4, standard deviation 2, over the root of 3.
        let (m, se) = mean_and_se(&[1.0, 3.0, 5.0]);
        assert_eq!(m, 3.0);
        assert!((se - 2.0 / 3f64.sqrt()).abs() < 1e-12, "{se}");
        assert_eq!(mean_and_se(&[7.0]), (7.0, 0.0));
        assert_eq!(mean_and_se(&[]), (0.0, 0.0));
    }
}
