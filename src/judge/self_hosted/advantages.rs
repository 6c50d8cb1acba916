//! Every trajectory's advantage under one advantage convention (f64 and as an f32
//! trainer holds it).

use super::*;

/// Every trajectory's advantage under one convention, by trajectory index.
#[derive(Debug, Clone)]
pub struct Advantages {
    pub(super) f64s: Vec<f64>,
    pub(super) f32s: Vec<f64>,
}

impl Advantages {
    /// The advantage of each micro row (`rows`: trajectory indexes), f32-rounded when the
    /// trainer is f32 ([`MicroInputs::f32_trainer`]), as [`SelfHostedStep::micro_inputs`]
    /// takes them.
    pub fn of_rows(&self, rows: &[usize], f32_trainer: bool) -> Vec<f64> {
        let v = if f32_trainer { &self.f32s } else { &self.f64s };
        rows.iter()
            .map(|i| v.get(*i).copied().unwrap_or(f64::NAN))
            .collect()
    }
}

/// Group advantages of `rewards` under `adv` (f64 and f32-rounded); errors name `tf`.
pub(super) fn advantages_of(
    tf: &Path,
    rewards: &[f64],
    (groups, runs): (&[String], &[Option<String>]),
    adv: &AdvantageConfig,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let f64s = group_advantages_runs(rewards, groups, runs, adv)
        .map_err(|e| Error::format(tf, Position::Key("trajectories".into()), e.to_string()))?;
    let f32s = f64s.iter().map(|a| round_f32(*a)).collect();
    Ok((f64s, f32s))
}
