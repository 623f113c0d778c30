//! Everything under `/console`: one router, every page in the one layout
//! ([`super::views::page`]), all with the console's security headers.

use super::super::state::AppState;
use super::{assets, pages, parked, retries};

pub fn router() -> axum::Router<AppState> {
    use axum::routing::get;
    pages::routes()
        .merge(parked::routes())
        .merge(retries::routes())
        .route(assets::STYLE_PATH, get(assets::style))
        .route(assets::SCRIPT_PATH, get(assets::script))
        .layer(axum::middleware::map_response(
            assets::with_security_headers,
        ))
}
