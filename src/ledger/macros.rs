//! The ledger's two macros, `on_pool!` and `in_tx!`: a query, or a
//! transaction, written once and expanded once per backend.

/// Runs `$body` with `$pool` bound to the backend's own pool type: the body
/// is type-checked (and compiled) once per backend.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::ledger::pool::Pool::Sqlite($p) => $body,
            $crate::ledger::pool::Pool::Postgres($p) => $body,
        }
    };
}

/// Runs `$body` in a transaction on either backend's pool, `$t` bound to
/// it, and commits; an early return (`?`) rolls it back. `QueryContext` must
/// be in scope.
macro_rules! in_tx {
    ($pool:expr, $t:ident => $body:expr) => {
        match $pool {
            $crate::ledger::pool::Pool::Sqlite(p) => {
                let mut $t = p.begin().await.context("starting a transaction")?;
                let value = $body;
                $t.commit().await.context("committing")?;
                value
            }
            $crate::ledger::pool::Pool::Postgres(p) => {
                let mut $t = p.begin().await.context("starting a transaction")?;
                let value = $body;
                $t.commit().await.context("committing")?;
                value
            }
        }
    };
}
