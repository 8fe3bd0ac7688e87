//! Measures of a prediction stream (EdgeServe §6.2): real-time accuracy
//! (each prediction scored against the last known label at the time it was
//! made), the actual prediction frequency and its variability, and excess
//! work (items processed beyond one per prediction).

/// Real-time accuracy: the share of predictions `(time, label)` equal to
/// the ground truth `(time, label)` last known at the prediction's time
/// (truth in time order). Predictions before the first label are not
/// scored; `None` when none is.
pub fn realtime_accuracy<L: PartialEq>(
    predictions: &[(u64, L)],
    truth: &[(u64, L)],
) -> Option<f64> {
    let mut scored = 0usize;
    let mut right = 0usize;
    for (t, p) in predictions {
        let known = truth.partition_point(|(ts, _)| ts <= t);
        if known == 0 {
            continue;
        }
        scored += 1;
        if truth[known - 1].1 == *p {
            right += 1;
        }
    }
    (scored > 0).then(|| right as f64 / scored as f64)
}

/// Mean and standard deviation of the intervals between predictions.
pub fn frequency(times: &[u64]) -> Option<(f64, f64)> {
    if times.len() < 2 {
        return None;
    }
    let gaps: Vec<f64> = times
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let var = gaps.iter().map(|g| (g - mean) * (g - mean)).sum::<f64>() / gaps.len() as f64;
    Some((mean, var.sqrt()))
}

/// Items processed beyond one per prediction made.
pub fn excess(processed: u64, predictions: u64) -> u64 {
    processed.saturating_sub(predictions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_scored_against_the_label_known_when_it_was_made() {
        let truth = [(10, 'a'), (20, 'b'), (30, 'c')];
        // At 25 the last known label is b; at 5 none is known yet.
        let preds = [(5, 'a'), (15, 'a'), (25, 'c'), (30, 'c')];
        assert_eq!(realtime_accuracy(&preds, &truth), Some(2.0 / 3.0));
        assert_eq!(realtime_accuracy(&[(1, 'a')], &truth), None);
    }

    #[test]
    fn frequency_and_excess() {
        assert_eq!(frequency(&[0, 10, 20, 30]), Some((10.0, 0.0)));
        let (m, sd) = frequency(&[0, 10, 30]).unwrap();
        assert_eq!((m, sd), (15.0, 5.0));
        assert_eq!(frequency(&[5]), None);
        assert_eq!(excess(10, 4), 6);
        assert_eq!(excess(2, 4), 0);
    }
}
