//! `sluice plan`: cost-optimal model selection and worker assignment for
//! inference workflows on tiered infrastructure, after JellyBean
//! (dissertation ch. 5 in `shared/seeds/004_…`).
//!
//! Pipeline: [`load`] an input (a JellyBean directory or our TOML/JSON file)
//! into a [`Problem`]; [`select::beam_search`] picks candidate model
//! selections that meet the accuracy target; [`assign`] places each
//! candidate on workers (the paper's Algorithm 1 over several seeded
//! topological orders, plus our extensions and a local-search polish);
//! [`exhaustive`] computes the optimum for small instances; [`baselines`]
//! gives Best Fit and First Fit. Everything is deterministic given a seed.
//!
//! Architecture invariants: no network, no async; the only I/O is reading
//! inputs (`load`) and writing exports (`export`). Costs are per hour.

pub mod accuracy;
pub mod assign;
pub mod baselines;
pub mod error;
pub mod exhaustive;
pub mod export;
pub mod gen;
pub mod load;
pub mod place;
pub mod problem;
pub mod report;
pub mod rng;
pub mod select;

pub use error::PlanError;
pub use problem::{Plan, Problem};
pub use report::{plan_all, PlanOptions, PlanReport};
