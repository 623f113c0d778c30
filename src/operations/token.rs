//! `token create`: a new client token, and the clients-file entry that names
//! it by its hash, checked as the service would check it before anything is
//! printed or written.

use std::io::Write;
use std::path::Path;

use super::OperationError;
use crate::auth::{ClientSet, parse_clients_file, token};
use crate::auth::{ClientSettings, TokenHashes};

/// The client a token is made for.
#[derive(Clone, Debug)]
pub struct NewClient {
    pub name: String,
    pub destinations: Vec<String>,
    pub exchanges: Vec<String>,
    pub permissions: Vec<String>,
    pub rate_per_second: Option<u32>,
    pub burst: Option<u32>,
    pub max_scheduled: Option<u64>,
}

/// A token made: the secret (shown once: delayline keeps only its SHA-256)
/// and the client's entry for the clients file.
#[derive(Clone, Debug)]
pub struct CreatedToken {
    pub token: String,
    pub entry: String,
}

/// Makes a token for `client`; with `append_to`, appends its entry to that
/// clients file, and only if the file still reads, with every client, once
/// the entry is in (a service would keep its old clients on a reload otherwise).
pub fn create_token(
    client: NewClient,
    append_to: Option<&Path>,
) -> Result<CreatedToken, OperationError> {
    let token = token::generate();
    let entry = ClientSettings {
        name: client.name,
        token_sha256: TokenHashes::One(token::hash_hex(&token)),
        destinations: client.destinations,
        exchanges: client.exchanges,
        permissions: client.permissions,
        rate_per_second: client.rate_per_second,
        burst: client.burst,
        max_scheduled: client.max_scheduled,
    };
    ClientSet::build(std::slice::from_ref(&entry), None)?;
    let entry = client_entry_toml(&entry);
    if let Some(path) = append_to {
        append_entry(path, &entry)?;
    }
    Ok(CreatedToken { token, entry })
}

fn append_entry(path: &Path, entry: &str) -> Result<(), OperationError> {
    let file_error = |action, source| OperationError::File {
        action,
        path: path.display().to_string(),
        source,
    };
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(file_error("read", e)),
    };
    let clients = parse_clients_file(&format!("{existing}\n{entry}"), path).map_err(|e| {
        OperationError::Refused(format!(
            "{e}; nothing was appended (a `clients = []` line cannot be followed by \
             [[clients]] entries: remove it)"
        ))
    })?;
    ClientSet::build(&clients, None)
        .map_err(|e| OperationError::Refused(format!("{e}; nothing was appended")))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| file_error("open", e))?;
    write!(file, "\n{entry}").map_err(|e| file_error("write", e))
}

/// One `[[clients]]` table, as the clients file holds it.
fn client_entry_toml(entry: &ClientSettings) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut text = format!(
        "[[clients]]\nname = {:?}\ntoken_sha256 = {:?}\ndestinations = {}\npermissions = {}\n",
        entry.name,
        entry
            .token_sha256
            .as_slice()
            .first()
            .cloned()
            .unwrap_or_default(),
        list(&entry.destinations),
        list(&entry.permissions),
    );
    if !entry.exchanges.is_empty() {
        text.push_str(&format!("exchanges = {}\n", list(&entry.exchanges)));
    }
    if let Some(rate) = entry.rate_per_second {
        text.push_str(&format!("rate_per_second = {rate}\n"));
    }
    if let Some(burst) = entry.burst {
        text.push_str(&format!("burst = {burst}\n"));
    }
    if let Some(max) = entry.max_scheduled {
        text.push_str(&format!("max_scheduled = {max}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_appended_only_where_the_file_still_reads_with_every_client() {
        let dir = std::env::temp_dir().join(format!("dl-token-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let new = |name: &str| NewClient {
            name: name.to_owned(),
            destinations: vec!["#".to_owned()],
            exchanges: vec!["orders".to_owned()],
            permissions: vec!["submit".to_owned()],
            rate_per_second: None,
            burst: None,
            max_scheduled: None,
        };
        let fresh = dir.join("fresh.toml");
        create_token(new("a"), Some(&fresh)).unwrap();
        create_token(new("b"), Some(&fresh)).unwrap();
        let read = parse_clients_file(&std::fs::read_to_string(&fresh).unwrap(), &fresh);
        assert_eq!(read.unwrap().len(), 2);
        // The same name twice would not load: refused, nothing written.
        let before = std::fs::read_to_string(&fresh).unwrap();
        assert!(create_token(new("a"), Some(&fresh)).is_err());
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), before);
        // An inline empty list cannot take [[clients]] entries after it.
        let inline = dir.join("inline.toml");
        std::fs::write(&inline, "clients = []\n").unwrap();
        let error = create_token(new("a"), Some(&inline))
            .unwrap_err()
            .to_string();
        assert!(error.contains("clients = []"), "{error}");
        assert_eq!(std::fs::read_to_string(&inline).unwrap(), "clients = []\n");
        let _ = std::fs::remove_dir_all(dir);
    }
}
