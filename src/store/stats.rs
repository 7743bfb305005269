//! Per-minute rates for `GET /v1/stats` (docs/operators.md, "Rates over the
//! last hour"): what each server counted, added up in one small table
//! (`stats_minutes`) that the servers of one database share.
//!
//! Adding a counter: one line in the `counters!` list below, and a migration
//! adding its column (`BIGINT NOT NULL DEFAULT 0`) on both backends, and
//! its field in the API's `RateCounts` (src/http/wire/rates.rs; the
//! compiler points there). The SQL of both backends follows the list.

use super::StoreResult;
use super::rows::{to_i64, to_u64};

/// Length of one entry of the series.
pub const STATS_MINUTE_MS: u64 = 60_000;

/// How long rows are kept: twice the hour served, so a late flush from a
/// replica still lands in a row that is read.
pub const STATS_KEEP_MS: u64 = 2 * 3_600_000;

/// The start of the minute holding `ms`.
#[must_use]
pub const fn minute_of(ms: u64) -> u64 {
    ms - ms % STATS_MINUTE_MS
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// What happened in one minute, summed over every server.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsCounts {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl StatsCounts {
            /// The column names, in the order of [`Self::values`].
            pub const COLUMNS: &'static [&'static str] = &[$(stringify!($name)),*];

            /// The counters, in the order of [`Self::COLUMNS`].
            #[must_use]
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$name),*]
            }

            /// Counters from values in the order of [`Self::COLUMNS`]
            /// (missing ones are 0).
            #[must_use]
            pub fn from_values(values: &[u64]) -> Self {
                let mut values = values.iter().copied();
                Self {
                    $($name: values.next().unwrap_or(0),)*
                }
            }

            /// Add `other` to these counters.
            pub fn add(&mut self, other: &Self) {
                $(self.$name = self.$name.saturating_add(other.$name);)*
            }

            /// Nothing counted.
            #[must_use]
            pub fn is_zero(&self) -> bool {
                *self == Self::default()
            }
        }
    };
}

counters! {
    /// Receipts stored for the first time (an identical receipt sent again is not counted).
    enqueued,
    /// Outcomes `accepted` committed: receipts settled.
    settled,
    /// Outcomes `skipped` committed.
    skipped,
    /// Failures committed that were scheduled for another attempt.
    retried,
    /// Failures committed that dead-lettered their receipt (permanent, or out of retries).
    dead_lettered,
    /// Writes refused as conflicts (stale, forged or late claims), as `settled_conflicts_total`.
    conflicts,
}

/// One minute of the series as stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsMinute {
    /// Start of the minute, in server ms (a multiple of [`STATS_MINUTE_MS`]).
    pub minute_ms: u64,
    pub counts: StatsCounts,
    /// Active receipts (pending, leased, retry scheduled) last sampled in
    /// this minute; `None` when no server sampled it.
    pub depth: Option<u64>,
}

impl StatsMinute {
    /// The values bound to [`upsert_sql`]: `minute_ms`, the counters, `depth`.
    pub fn params(&self) -> StoreResult<(i64, Vec<i64>, Option<i64>)> {
        let counts = self
            .counts
            .values()
            .into_iter()
            .map(|v| to_i64(v, "stats counter"))
            .collect::<StoreResult<_>>()?;
        let depth = self.depth.map(|d| to_i64(d, "stats depth")).transpose()?;
        Ok((to_i64(self.minute_ms, "minute_ms")?, counts, depth))
    }

    /// A row read by [`select_sql`].
    pub fn from_row<R>(row: &R) -> StoreResult<Self>
    where
        R: sqlx::Row,
        usize: sqlx::ColumnIndex<R>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let n = StatsCounts::COLUMNS.len();
        let minute_ms = to_u64(row.try_get(0)?, "minute_ms")?;
        let values = (1..=n)
            .map(|i| to_u64(row.try_get(i)?, "stats counter"))
            .collect::<StoreResult<Vec<u64>>>()?;
        let depth: Option<i64> = row.try_get(n + 1)?;
        Ok(Self {
            minute_ms,
            counts: StatsCounts::from_values(&values),
            depth: depth.map(|d| to_u64(d, "stats depth")).transpose()?,
        })
    }
}

/// The upsert adding one minute's deltas, `?` placeholders numbered by
/// `placeholder(n)` (1-based): counters add up, the depth is the latest
/// sample (kept when the delta has none).
#[must_use]
pub fn upsert_sql(placeholder: impl Fn(usize) -> String) -> String {
    let columns = StatsCounts::COLUMNS;
    let names = columns.join(", ");
    let values: Vec<String> = (1..=columns.len() + 2).map(&placeholder).collect();
    let sums: Vec<String> = columns
        .iter()
        .map(|c| format!("{c} = stats_minutes.{c} + excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO stats_minutes (minute_ms, {names}, depth) VALUES ({}) \
         ON CONFLICT (minute_ms) DO UPDATE SET {}, \
         depth = COALESCE(excluded.depth, stats_minutes.depth)",
        values.join(", "),
        sums.join(", ")
    )
}

/// The read of rows with `minute_ms` in `[from, to)`, oldest first.
#[must_use]
pub fn select_sql(from: &str, to: &str) -> String {
    format!(
        "SELECT minute_ms, {}, depth FROM stats_minutes \
         WHERE minute_ms >= {from} AND minute_ms < {to} ORDER BY minute_ms",
        StatsCounts::COLUMNS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_columns_agree() {
        let counts = StatsCounts {
            enqueued: 1,
            settled: 2,
            skipped: 3,
            retried: 4,
            dead_lettered: 5,
            conflicts: 6,
        };
        assert_eq!(StatsCounts::COLUMNS.len(), counts.values().len());
        assert_eq!(StatsCounts::from_values(&counts.values()), counts);
    }

    #[test]
    fn the_upsert_adds_every_counter_and_keeps_the_latest_depth() {
        let sql = upsert_sql(|n| format!("${n}"));
        assert!(
            sql.contains("VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"),
            "{sql}"
        );
        assert!(sql.contains("conflicts = stats_minutes.conflicts + excluded.conflicts"));
        assert!(sql.contains("depth = COALESCE(excluded.depth, stats_minutes.depth)"));
        assert_eq!(minute_of(125_000), 120_000);
    }
}
