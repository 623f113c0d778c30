//! `/console`: a web console served by the binary itself, server-rendered
//! HTML (`views`, with maud) and one small script (the level chart's
//! refresh), nothing fetched from elsewhere.
//!
//! It reads and acts only through the scheduler, as the API does, and with
//! the API's permissions: a client signs in with its token and gets a
//! server-side session (`sessions`), whose id is kept in an HttpOnly,
//! SameSite=Strict cookie; every form that changes something carries a
//! token derived from the session (`csrf`) and is refused from another
//! site. A button the caller may not use is not shown, and the server
//! refuses the action anyway. Every answer carries a Content-Security-Policy
//! that allows nothing but this origin's own files (`assets`: the style
//! sheet and the chart's script), and refuses framing.

mod assets;
mod pages;
mod parked;
mod retries;
mod router;
pub(super) mod sessions;
mod views;

pub use router::router;
