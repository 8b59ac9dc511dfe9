//! Provider options: string key/values, with unknown keys reported by name.

use crate::status::{Error, Result};

/// The options a user passed when creating an EP. Take the keys the EP knows, then call
/// [`finish`](Self::finish): anything left is an unknown key, reported with the valid ones.
#[derive(Clone, Debug)]
pub struct ProviderOptions {
    provider: String,
    entries: Vec<(String, String)>,
    known: Vec<&'static str>,
}

impl ProviderOptions {
    pub fn new(provider: &str, entries: Vec<(String, String)>) -> Self {
        ProviderOptions {
            provider: provider.to_string(),
            entries,
            known: Vec::new(),
        }
    }

    /// Takes a string option (the last one given wins).
    pub fn take(&mut self, key: &'static str) -> Option<String> {
        self.known.push(key);
        self.remove(key)
    }

    /// Removes every entry of `key`; returns the last one's value.
    fn remove(&mut self, key: &str) -> Option<String> {
        let mut found = None;
        self.entries.retain(|(k, v)| {
            if k == key {
                found = Some(v.clone());
                false
            } else {
                true
            }
        });
        found
    }

    /// Takes an option and parses it, naming the key and the expected form on failure.
    pub fn take_parsed<T: std::str::FromStr>(
        &mut self,
        key: &'static str,
        expected: &str,
    ) -> Result<Option<T>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                Error::invalid_argument(format!(
                    "{} option `{key}`: `{v}` is not {expected}",
                    self.provider
                ))
            }),
        }
    }

    /// (ABI 1.5) The `device_id` of the device the session chose among those
    /// [`ProviderFactory::devices`](crate::sdk::ProviderFactory::devices) listed, if it chose
    /// one. An EP that lists devices takes it; left untaken, [`finish`](Self::finish) fails.
    pub fn take_device(&mut self) -> Result<Option<u32>> {
        let found = self.remove(crate::abi::EPX_DEVICE_OPTION);
        found
            .map(|v| {
                v.trim().parse::<u32>().map_err(|_| {
                    Error::invalid_argument(format!(
                        "{} device `{v}` is not a device id",
                        self.provider
                    ))
                })
            })
            .transpose()
    }

    /// Takes every option left (after the device choice, if any, was taken), for an EP that
    /// hands options it does not know on to a runtime that checks them itself (and reports an
    /// unknown one by name). Instead of [`finish`](Self::finish).
    pub fn take_rest(self) -> Vec<(String, String)> {
        self.entries
    }

    /// Fails if any option was not taken, naming it and listing the valid keys.
    pub fn finish(self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        if self
            .entries
            .iter()
            .any(|(k, _)| k == crate::abi::EPX_DEVICE_OPTION)
        {
            return Err(Error::invalid_argument(format!(
                "{} cannot run on a chosen device: the plugin does not take the host's device \
                 choice (`{}`)",
                self.provider,
                crate::abi::EPX_DEVICE_OPTION
            )));
        }
        let unknown: Vec<&str> = self.entries.iter().map(|(k, _)| k.as_str()).collect();
        let valid = if self.known.is_empty() {
            "it takes no options".to_string()
        } else {
            format!("valid keys: {}", self.known.join(", "))
        };
        Err(Error::invalid_argument(format!(
            "unknown {} option{} {}; {valid}",
            self.provider,
            if unknown.len() == 1 { "" } else { "s" },
            unknown
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_name_the_valid_ones() {
        let mut o = ProviderOptions::new(
            "cpu",
            vec![
                ("threads".into(), "4".into()),
                ("colour".into(), "red".into()),
            ],
        );
        assert_eq!(
            o.take_parsed::<usize>("threads", "a thread count").unwrap(),
            Some(4)
        );
        let err = o.finish().unwrap_err();
        assert_eq!(
            err.message,
            "unknown cpu option `colour`; valid keys: threads"
        );
    }

    #[test]
    fn bad_values_are_errors() {
        let mut o = ProviderOptions::new("cpu", vec![("threads".into(), "many".into())]);
        let err = o
            .take_parsed::<usize>("threads", "a thread count")
            .unwrap_err();
        assert_eq!(
            err.message,
            "cpu option `threads`: `many` is not a thread count"
        );
    }
}
