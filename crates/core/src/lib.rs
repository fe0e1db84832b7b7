//! gangway's domain model and pure rules (DESIGN §2, §4): no I/O, no async.
//!
//! - [`model`]: service and instance identities and fields;
//! - [`validate`]: the input rules, each error naming its field;
//! - [`view`]: the consumer view of a service and the protect threshold;
//! - [`drain`]: which subscribers have acked a revision and which lag, and the report of a
//!   drain or readiness wait.
//!
//! ```
//! use gangway_core::model::{Instance, InstanceKey};
//! use gangway_core::view::View;
//!
//! let mut up = Instance::new(InstanceKey::new("10.0.0.1", 8080, "DEFAULT"));
//! let mut down = Instance::new(InstanceKey::new("10.0.0.2", 8080, "DEFAULT"));
//! down.healthy = false;
//! let view = View::build(7, [&up, &down], 0.0);
//! assert_eq!(view.instances.len(), 1);
//! assert!(!view.protection_triggered);
//! // The protect threshold (here 0.5) fires at healthy/enabled = 1/2: both are listed,
//! // each with its real health flag.
//! let protected = View::build(8, [&up, &down], 0.5);
//! assert!(protected.protection_triggered);
//! assert_eq!(protected.instances.len(), 2);
//! up.enabled = false; // offline
//! assert!(!View::build(9, [&up], 0.0).contains(&up.key));
//! ```

pub mod drain;
pub mod duration;
pub mod model;
pub mod validate;
pub mod view;

pub use model::{Instance, InstanceKey, Kind, ServiceKey};
pub use validate::ValidationError;
pub use view::{Tally, View};
