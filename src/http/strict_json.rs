//! JSON read strictly: an object with the same key twice is refused at any
//! depth, because parsers disagree on which copy wins (first, last, or an
//! error) and a stored observation must mean one thing to every reader.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// How serde_json (with `arbitrary_precision`) hands a number to a visitor:
/// a one-entry map from this key to the number's text. serde_json's own
/// `Value` reads it the same way.
const NUMBER_KEY: &str = "$serde_json::private::Number";

/// `deserialize_with` for an optional free-form JSON value: refuses
/// duplicate keys anywhere inside it, and keeps numbers as the text sent.
/// Read in one pass, so serde_json's nesting limit still makes a too-deep
/// value malformed JSON (400) rather than a bad field.
pub fn unique_keys<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Ok(Option::<Strict>::deserialize(deserializer)?
        .map(|s| s.0)
        .filter(|v| !v.is_null()))
}

/// A JSON value whose objects have no repeated key.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Strict::deserialize(deserializer).map(|s| s.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.is_empty() && key == NUMBER_KEY {
                let text: String = map.next_value()?;
                let number = text.parse::<Number>().map_err(de::Error::custom)?;
                return Ok(Value::Number(number));
            }
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key `{key}` in an object"
                )));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Value, serde_json::Error> {
        serde_json::from_str::<Strict>(text).map(|s| s.0)
    }

    #[test]
    fn repeated_keys_are_refused_at_any_depth_and_numbers_kept() {
        let text = r#"{"a":1,"b":{"a":2.50},"c":[{"a":123456789012345678901}],"d":null,"e":true}"#;
        let value = read(text).unwrap();
        assert_eq!(value, serde_json::from_str::<Value>(text).unwrap());
        assert_eq!(value["c"][0]["a"].to_string(), "123456789012345678901");
        assert_eq!(value["b"]["a"].to_string(), "2.50");
        assert!(read(r#"{"a":1,"a":1}"#).is_err());
        assert!(read(r#"{"x":[{"b":{"a":1,"a":2}}]}"#).is_err());
        // Escapes are compared after decoding: these are the same key.
        assert!(read(r#"{"a":1,"\u0061":2}"#).is_err());
        assert!(read(&format!("{}1{}", "[".repeat(200), "]".repeat(200))).is_err());
    }
}
