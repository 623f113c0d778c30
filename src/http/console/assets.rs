//! The console's own files: its style sheet and its one script (the level
//! chart's refresh, and the confirmation a form with `data-confirm` asks),
//! served from this origin so that the pages need no inline style or
//! script, and the Content-Security-Policy every console answer carries
//! ([`with_security_headers`]) can allow nothing else.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

pub const STYLE_PATH: &str = "/console/assets/console.css";
pub const SCRIPT_PATH: &str = "/console/assets/console.js";

/// Small, and readable on a narrow screen; contrast at least 4.5:1.
const CSS: &str = "body{font:16px/1.5 system-ui,sans-serif;margin:0;color:#111;background:#fff}\
header{background:#1d3557;padding:.5rem 1rem}header a{color:#fff;margin-right:1rem}\
nav{display:flex;flex-wrap:wrap;align-items:center;row-gap:.3rem}\
header a:focus{outline:3px solid #ffb703}main{padding:1rem;max-width:70rem}\
table{border-collapse:collapse;width:100%;display:block;overflow-x:auto}\
th,td{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #ccc;vertical-align:top}\
th.wide{width:60%}.inline{display:inline}progress.bar{width:100%;height:1rem;accent-color:#1d3557}\
.notice{background:#fff3cd;padding:.5rem}\
.error{background:#f8d7da;padding:.5rem}pre{white-space:pre-wrap;word-break:break-all;\
background:#f4f4f4;padding:.5rem}label{display:inline-block;margin:.2rem .8rem .2rem 0}\
button,input,select{font:inherit;padding:.2rem .4rem}\
svg.forecast{width:100%;height:6rem;background:#f4f4f4}svg.forecast rect{fill:#1d3557}";

/// Asks before a form with `data-confirm` is sent (no inline handler: the
/// policy allows none), and, on the overview, refreshes the level chart
/// from `/console/levels` every 5 s.
const SCRIPT: &str = "document.addEventListener('submit',(e)=>{const m=e.target.dataset.confirm;\
if(m&&!confirm(m))e.preventDefault();});\
if(document.getElementById('levels-heading'))setInterval(async()=>{try{const r=await fetch('/console/levels');\
if(!r.ok)return;const l=await r.json();const m=Math.max(1,...l.map(x=>x.messages));\
for(const x of l){const b=document.getElementById('bar-'+x.level);\
const n=document.getElementById('n-'+x.level);if(b){b.max=m;b.value=x.messages;b.textContent=x.messages;}\
if(n)n.textContent=x.messages;}}catch(e){}},5000);";

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// What every console answer carries: only this origin's files, no
/// framing (clickjacking), no content-type guessing, no referrer leaving
/// the site (a task id in a URL stays here).
const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-opener-policy", "same-origin"),
];

pub async fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    response
}
