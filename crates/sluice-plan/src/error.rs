/// An input or planning error. Input errors name the file, the line (when
/// there is one) and the field.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{file}:{line}: {field}: {reason}")]
    Input {
        file: String,
        line: usize,
        field: String,
        reason: String,
    },
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("{file}: {field}: {reason}")]
    Field {
        file: String,
        field: String,
        reason: String,
    },
    #[error("invalid problem: {0}")]
    Invalid(String),
    #[error("no plan meets the accuracy target {target}: {reason}")]
    Infeasible { target: f64, reason: String },
    #[error("exhaustive search refused: about {states:.3e} states exceed the limit of {limit:.0e}; use the heuristic (drop --exhaustive) or a smaller instance")]
    TooLarge { states: f64, limit: f64 },
    #[error("writing {path}: {reason}")]
    Export { path: String, reason: String },
}

pub type Result<T> = std::result::Result<T, PlanError>;
