//! Who may do what: the model control mode (whether clients may load and unload models, or the
//! server follows the repository's folders itself) and the API groups restricted to clients that
//! send a given header, as Triton's `--model-control-mode` and `--http-restricted-api` /
//! `--grpc-restricted-protocol` do.

use std::fmt;
use std::str::FromStr;

use crate::protocol::ServeError;

/// Who changes the set of loaded models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlMode {
    /// Every model is loaded at start and stays so: load and unload requests are refused.
    #[default]
    None,
    /// Clients load and unload models (the repository extension); at start only the models
    /// named by `--load-model` are loaded (`*`: all).
    Explicit,
    /// The server reads the repository again every poll interval: a new or changed model folder
    /// is loaded, one that is gone is unloaded. Load and unload requests are refused.
    Poll,
}

impl ControlMode {
    pub fn name(self) -> &'static str {
        match self {
            ControlMode::None => "none",
            ControlMode::Explicit => "explicit",
            ControlMode::Poll => "poll",
        }
    }

    /// Refuses a load or unload request unless clients control the models.
    pub fn allow_change(self, what: &str) -> Result<(), ServeError> {
        if self == ControlMode::Explicit {
            return Ok(());
        }
        Err(ServeError::Forbidden(format!(
            "{what} requests are refused: this server runs with --model-control-mode {} \
             ({}); start it with --model-control-mode explicit to let clients load and unload \
             models",
            self.name(),
            match self {
                ControlMode::None => "the models loaded at start are the ones it serves",
                _ => "it follows the repository's folders itself",
            }
        )))
    }
}

impl FromStr for ControlMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ControlMode::None),
            "explicit" => Ok(ControlMode::Explicit),
            "poll" => Ok(ControlMode::Poll),
            other => Err(format!(
                "unknown model control mode `{other}` (none, explicit or poll)"
            )),
        }
    }
}

impl fmt::Display for ControlMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A group of endpoints that can be restricted, named as Triton names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiGroup {
    /// Server and model liveness and readiness.
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference.
    Inference,
    /// The repository extension: index, load, unload.
    ModelRepository,
    /// The statistics extension.
    Statistics,
}

impl ApiGroup {
    pub const ALL: [ApiGroup; 5] = [
        ApiGroup::Health,
        ApiGroup::Metadata,
        ApiGroup::Inference,
        ApiGroup::ModelRepository,
        ApiGroup::Statistics,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ApiGroup::Health => "health",
            ApiGroup::Metadata => "metadata",
            ApiGroup::Inference => "inference",
            ApiGroup::ModelRepository => "model-repository",
            ApiGroup::Statistics => "statistics",
        }
    }
}

impl FromStr for ApiGroup {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ApiGroup::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown API group `{s}` ({})",
                    ApiGroup::ALL.map(ApiGroup::name).join(", ")
                )
            })
    }
}

/// API groups answered only to requests carrying header `key` with value `value`:
/// `GROUP[,GROUP...]:KEY=VALUE`.
#[derive(Clone, PartialEq, Eq)]
pub struct Restriction {
    pub groups: Vec<ApiGroup>,
    /// Lower case: HTTP header names and gRPC metadata keys are compared without case.
    pub key: String,
    pub value: String,
}

// The value is a secret: never printed.
impl fmt::Debug for Restriction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Restriction")
            .field("groups", &self.groups)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl FromStr for Restriction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let form = "GROUP[,GROUP...]:KEY=VALUE";
        let (groups, header) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}` is not {form}"))?;
        let (key, value) = header
            .split_once('=')
            .ok_or_else(|| format!("`{s}` is not {form}: no `=` in the header part"))?;
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "`{key}` is not a header name (letters, digits, `-` and `_`)"
            ));
        }
        if value.is_empty() {
            return Err(format!("the restriction on `{groups}` has an empty value"));
        }
        let groups = groups
            .split(',')
            .map(|g| g.trim().parse())
            .collect::<Result<Vec<ApiGroup>, String>>()?;
        Ok(Restriction {
            groups,
            key,
            value: value.to_owned(),
        })
    }
}

/// The restrictions of one protocol (REST or gRPC).
#[derive(Debug, Clone, Default)]
pub struct Restrictions(Vec<Restriction>);

impl Restrictions {
    /// Refuses a group restricted twice: which key would it take?
    pub fn new(all: Vec<Restriction>) -> Result<Restrictions, String> {
        for g in ApiGroup::ALL {
            if all.iter().filter(|r| r.groups.contains(&g)).count() > 1 {
                return Err(format!("API group `{}` is restricted twice", g.name()));
            }
        }
        Ok(Restrictions(all))
    }

    /// Passes a request to `group` whose headers (`header(name)`, lower-case name) carry the key
    /// its restriction asks for, or that no restriction covers.
    pub fn check<'h>(
        &self,
        group: ApiGroup,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Result<(), ServeError> {
        let Some(r) = self.0.iter().find(|r| r.groups.contains(&group)) else {
            return Ok(());
        };
        if header(&r.key).is_some_and(|v| constant_time_eq(v.as_bytes(), r.value.as_bytes())) {
            return Ok(());
        }
        Err(ServeError::Forbidden(format!(
            "the {} API is restricted on this server: send header `{}` with the value it \
             was given",
            group.name(),
            r.key
        )))
    }
}

/// Compares without stopping at the first difference, so that the time a refusal takes does not
/// tell how much of a guessed value was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restrictions_parse_as_triton_writes_them() {
        let r: Restriction = "model-repository,statistics:Admin-Key=s3cr=t"
            .parse()
            .unwrap();
        assert_eq!(r.groups, [ApiGroup::ModelRepository, ApiGroup::Statistics]);
        assert_eq!((r.key.as_str(), r.value.as_str()), ("admin-key", "s3cr=t"));
        assert!(
            !format!("{r:?}").contains("s3cr"),
            "the value is not printed"
        );
        for bad in [
            "inference",
            "inference:key",
            "inference:=v",
            "inference:k=",
            "shared-memory:k=v",
            "inference:k y=v",
        ] {
            assert!(bad.parse::<Restriction>().is_err(), "{bad}");
        }
        let twice = vec![
            "inference:a=1".parse().unwrap(),
            "health,inference:b=2".parse().unwrap(),
        ];
        assert!(Restrictions::new(twice).unwrap_err().contains("inference"));
    }

    #[test]
    fn a_restricted_group_needs_its_header_and_others_do_not() {
        let r = Restrictions::new(vec!["model-repository:admin=yes".parse().unwrap()]).unwrap();
        let none = |_: &str| None;
        let right = |k: &str| (k == "admin").then_some("yes");
        let wrong = |k: &str| (k == "admin").then_some("no");
        assert!(r.check(ApiGroup::Inference, none).is_ok());
        assert!(r.check(ApiGroup::ModelRepository, right).is_ok());
        for h in [&none as &dyn Fn(&str) -> Option<&'static str>, &wrong] {
            let e = r.check(ApiGroup::ModelRepository, h).unwrap_err();
            assert!(matches!(e, ServeError::Forbidden(_)), "{e:?}");
            assert!(e.message().contains("`admin`") && !e.message().contains("yes"));
        }
    }

    #[test]
    fn only_explicit_control_lets_clients_load_and_unload() {
        assert!(ControlMode::Explicit.allow_change("load").is_ok());
        for mode in [ControlMode::None, ControlMode::Poll] {
            let e = mode.allow_change("unload").unwrap_err();
            assert!(
                e.message().contains("--model-control-mode explicit"),
                "{}",
                e.message()
            );
        }
        assert_eq!(ControlMode::default(), ControlMode::None);
        assert!("sometimes".parse::<ControlMode>().is_err());
    }
}
