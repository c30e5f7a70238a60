//! A 64-bit id (policy version and epoch, revocation epoch and
//! generation) written in JSON as a decimal string: JSON readers that keep
//! numbers as doubles (JavaScript, `jq`) lose digits above 2^53, and an
//! epoch is a random 64-bit value. Reading accepts a string or a number, so
//! this version still reads the answer of a node that wrote numbers.
//! Use with `#[serde(with = "id_string")]`.

use serde::{Deserialize as _, Deserializer, Serializer};

/// Writes `id` as a decimal string.
pub(crate) fn serialize<S: Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

/// Reads a decimal string or a number.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(u64),
    }
    match Either::deserialize(d)? {
        Either::Number(n) => Ok(n),
        Either::Text(t) => t
            .parse()
            .map_err(|e| serde::de::Error::custom(format!("id {t:?} is not a 64-bit number: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Id(#[serde(with = "super")] u64);

    #[test]
    fn ids_past_2_pow_53_survive_as_strings_and_numbers_still_read() {
        let big = u64::MAX - 1;
        let json = serde_json::to_string(&Id(big)).expect("json");
        assert_eq!(json, format!("\"{big}\""));
        assert_eq!(serde_json::from_str::<Id>(&json).expect("read"), Id(big));
        assert_eq!(serde_json::from_str::<Id>("7").expect("number"), Id(7));
        let e = serde_json::from_str::<Id>("\"x7\"").expect_err("not a number");
        assert!(e.to_string().contains("x7"), "{e}");
    }
}
