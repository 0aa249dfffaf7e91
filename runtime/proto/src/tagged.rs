//! Reading an internally tagged enum (`{"t": "daemon", …}`) tag first. serde's derive reads
//! such an object whole into a buffer of its own before it looks at the tag, and an enum
//! nested in another is buffered again at each level: a daemon's every frame is three
//! levels deep (frame, daemon message, job-exec message), and reading them was a tenth of a
//! daemon's work per job. This crate writes the tag first, so the variant is known after
//! the first key and its fields are read straight from the rest of the object. An object
//! whose tag comes later (another writer's) is still read, through a buffer.
//!
//! [`tag_first!`] declares such an enum once: it derives the enum's `Serialize` as written
//! (internally tagged) and, for reading, an externally tagged twin of the same variants
//! (serde's `remote` derive, which builds the enum itself), so every field attribute is
//! serde's own.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, MapDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, IntoDeserializer, MapAccess,
    VariantAccess, Visitor,
};
use serde_json::Value;

/// An enum read tag first; implemented by [`tag_first!`].
pub trait TagFirst: Sized {
    /// The tag's key.
    const TAG: &'static str;
    /// Whether a tag this build does not know stands for the enum's last variant (serde's
    /// `#[serde(other)]`).
    const OTHER: bool;
    /// The twin's read: `d` offers one enum whose variant is the tag's value and whose
    /// content is the rest of the object.
    fn by_name<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// `Deserialize::deserialize` of a [`TagFirst`] enum.
pub fn deserialize<'de, D: Deserializer<'de>, T: TagFirst>(d: D) -> Result<T, D::Error> {
    d.deserialize_map(TagFirstVisitor(PhantomData))
}

struct TagFirstVisitor<T>(PhantomData<T>);

impl<'de, T: TagFirst> Visitor<'de> for TagFirstVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object tagged by {:?}", T::TAG)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let first: Option<String> = map.next_key()?;
        let Some(first) = first else {
            return Err(de::Error::missing_field(T::TAG));
        };
        if first == T::TAG {
            let variant: String = map.next_value()?;
            return T::by_name(ByName::<T, A> {
                variant,
                rest: map,
                enum_: PhantomData,
            });
        }
        // Another writer's order: the object is buffered, and read once its tag is found.
        let mut entries = vec![(first, map.next_value::<Value>()?)];
        while let Some(entry) = map.next_entry::<String, Value>()? {
            entries.push(entry);
        }
        let at = entries
            .iter()
            .position(|(k, _)| k == T::TAG)
            .ok_or_else(|| de::Error::missing_field(T::TAG))?;
        let variant = match entries.remove(at).1 {
            Value::String(s) => s,
            other => {
                return Err(de::Error::invalid_type(
                    de::Unexpected::Other(&other.to_string()),
                    &"a variant name",
                ))
            }
        };
        let rest = MapDeserializer::<_, serde_json::Error>::new(entries.into_iter());
        T::by_name(ByName::<T, _> {
            variant,
            rest,
            enum_: PhantomData,
        })
        .map_err(de::Error::custom)
    }
}

/// The variant named by the tag, with the rest of its object: an externally tagged enum to
/// the twin's derive.
struct ByName<T, A> {
    variant: String,
    rest: A,
    enum_: PhantomData<T>,
}

impl<'de, T: TagFirst, A: MapAccess<'de>> Deserializer<'de> for ByName<T, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        mut self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        if T::OTHER && !variants.contains(&self.variant.as_str()) {
            if let Some(other) = variants.last() {
                self.variant = (*other).to_string();
            }
        }
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

impl<'de, T: TagFirst, A: MapAccess<'de>> EnumAccess<'de> for ByName<T, A> {
    type Error = A::Error;
    type Variant = Rest<A>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Rest<A>), A::Error> {
        let name: de::value::StringDeserializer<A::Error> = self.variant.into_deserializer();
        Ok((seed.deserialize(name)?, Rest(self.rest)))
    }
}

/// The entries after the tag: the variant's fields.
struct Rest<A>(A);

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Rest<A> {
    type Error = A::Error;

    fn unit_variant(mut self) -> Result<(), A::Error> {
        // Fields a unit variant does not have are ignored, as serde's own read does.
        while self.0.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        seed.deserialize(MapAccessDeserializer::new(self.0))
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, A::Error> {
        Err(de::Error::custom(
            "a tuple variant cannot be internally tagged",
        ))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self.0)
    }
}

/// Declares an internally tagged enum read tag first (see the module documentation). The
/// enum's `#[serde(…)]` container attributes apply to both reads; the enum must not derive
/// `Deserialize` itself:
///
/// ```ignore
/// tag_first! {
///     tag = "t", name = "Frame", other = none;
///     /// Doc.
///     #[derive(Debug, Clone, PartialEq, Serialize)]
///     #[serde(rename_all = "snake_case")]
///     pub enum Frame { Hello(Hello), Refuse { reason: String }, }
/// }
/// ```
///
/// `other = Unknown` adds a unit variant `Unknown`, taken for any tag this build does not
/// know (serde's `#[serde(other)]`).
#[macro_export]
macro_rules! tag_first {
    (tag = $tag:literal, name = $sname:literal, other = none; $($rest:tt)*) => {
        $crate::tag_first!(@enum $tag, $sname, false, [], $($rest)*);
    };
    (tag = $tag:literal, name = $sname:literal, other = $other:ident; $($rest:tt)*) => {
        $crate::tag_first!(@enum $tag, $sname, true, [$other], $($rest)*);
    };
    (
        @enum $tag:literal, $sname:literal, $has_other:literal, [$($other:ident)?],
        $(#[doc = $doc:literal])*
        #[derive($($derive:path),*)]
        #[serde($($serde:tt)*)]
        $vis:vis enum $name:ident { $($body:tt)* }
    ) => {
        $(#[doc = $doc])*
        #[derive($($derive),*)]
        #[serde(tag = $tag, $($serde)*)]
        $vis enum $name {
            $($body)*
            $(
                /// A message kind this build does not know (sent by a newer peer).
                #[serde(other)]
                $other,
            )?
        }

        $crate::tag_first!(@read $tag, $sname, $has_other, $name, [$($serde)*], { $($body)* $($other,)? });
    };
    (@read $tag:literal, $sname:literal, $other:literal, $name:ident, [$($serde:tt)*], { $($body:tt)* }) => {
        const _: () = {
            /// The enum's variants, externally tagged: what reads the rest of an object once
            /// its tag is known.
            #[derive(serde::Deserialize)]
            #[serde(remote = $sname, $($serde)*)]
            #[allow(dead_code)]
            enum Twin { $($body)* }

            impl $crate::tagged::TagFirst for $name {
                const TAG: &'static str = $tag;
                const OTHER: bool = $other;
                fn by_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    Twin::deserialize(d)
                }
            }

            impl<'de> serde::Deserialize<'de> for $name {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    $crate::tagged::deserialize(d)
                }
            }
        };
    };
}

#[cfg(test)]
mod tests {
    use crate::exec::{ExecDown, ExecUp, JobSpec, JobTuple, Jobs, UpdateType};
    use crate::idset::IdSet;
    use crate::placement::{MapBy, Placement};
    use crate::wire::{DaemonMsg, Frame};

    fn frames() -> Vec<Frame> {
        let spec = JobSpec {
            argv: vec!["/bin/true".into()],
            env: vec![("A".into(), "b".into())],
            cwd: Some("/tmp".into()),
            placement: Placement::new(3, vec![1, 2, 3], MapBy::Node),
            stdin: false,
        };
        let down = |msg| Frame::Daemon(DaemonMsg::ExecDown { msg });
        vec![
            down(ExecDown::JobInfo {
                idset: IdSet::range(1, 3),
                id: 7,
                spec,
            }),
            down(ExecDown::StateUpdate {
                idset: IdSet::range(0, 3),
                data: Jobs {
                    jobs: vec![JobTuple(7, 0, UpdateType::Add, IdSet::range(1, 3))],
                },
                answer: false,
            }),
            down(ExecDown::StateUpdate {
                idset: IdSet::range(2, 2),
                data: Jobs { jobs: vec![] },
                answer: true,
            }),
            Frame::Daemon(DaemonMsg::ExecUp {
                req: ExecUp::Finish {
                    id: 7,
                    ranks: IdSet::range(2, 2),
                    status: 256,
                },
            }),
            Frame::Daemon(DaemonMsg::ExecUp { req: ExecUp::Hello }),
            Frame::Daemon(DaemonMsg::Heartbeat),
            Frame::Refuse {
                reason: "no".into(),
            },
        ]
    }

    /// The same object with every level's keys in sorted order: each tag comes after some
    /// of its fields, as another writer may put it.
    fn tag_later(f: &Frame) -> String {
        serde_json::to_string(&serde_json::to_value(f).unwrap()).unwrap()
    }

    #[test]
    fn a_frame_reads_the_same_whether_its_tags_come_first_or_later() {
        for f in frames() {
            let first = serde_json::to_string(&f).unwrap();
            assert!(first.starts_with(r#"{"t":"#), "{first}");
            assert_eq!(serde_json::from_str::<Frame>(&first).unwrap(), f, "{first}");
            let later = tag_later(&f);
            assert_eq!(serde_json::from_str::<Frame>(&later).unwrap(), f, "{later}");
        }
        assert!(tag_later(&frames()[0]).starts_with(r#"{"msg":{"id":7,"#));
    }

    #[test]
    fn a_message_kind_this_build_does_not_know_reads_as_unknown_in_either_order() {
        for text in [
            r#"{"t":"daemon","op":"from_the_future","x":[1,{"y":2}]}"#,
            r#"{"x":[1,{"y":2}],"op":"from_the_future","t":"daemon"}"#,
        ] {
            let f: Frame = serde_json::from_str(text).unwrap();
            assert_eq!(f, Frame::Daemon(DaemonMsg::Unknown), "{text}");
        }
    }

    #[test]
    fn fields_a_variant_does_not_have_are_ignored_and_a_missing_one_is_named() {
        let f: Frame =
            serde_json::from_str(r#"{"t":"daemon","op":"heartbeat","extra":{"a":[1]}}"#).unwrap();
        assert_eq!(f, Frame::Daemon(DaemonMsg::Heartbeat));
        let e = serde_json::from_str::<Frame>(r#"{"t":"refuse"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `reason`"), "{e}");
        let e = serde_json::from_str::<Frame>(r#"{"reason":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `t`"), "{e}");
        let e = serde_json::from_str::<Frame>(r#"{"t":"nonsense"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `nonsense`"), "{e}");
        let e = serde_json::from_str::<Frame>(r#"{"t":3}"#).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        assert!(serde_json::from_str::<Frame>(r#"[]"#).is_err());
        assert!(serde_json::from_str::<Frame>(r#"{"t":"daemon","op":"heartbeat"} x"#).is_err());
    }
}
