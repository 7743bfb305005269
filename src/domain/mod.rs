//! The settlement domain: bounds, claims, outcomes, routes, and the retry policy.

mod claim;
mod group;
mod lease_token;
mod policy;
mod priority;
mod rail_code;
mod reasons;
mod route;
mod rules;
mod text;
mod time;
mod trace;

pub use claim::*;
pub use group::*;
pub use lease_token::*;
pub use policy::*;
pub use priority::*;
pub use rail_code::*;
pub use reasons::*;
pub use route::*;
pub use rules::*;
pub use text::*;
pub use time::*;
pub use trace::*;
