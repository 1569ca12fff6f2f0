//! HTTP basic auth against bcrypt hashes (`basic_auth_users` of the web config), as the
//! exporter-toolkit checks it: an unknown user costs one bcrypt of a hash of the same cost,
//! so timing tells no user names; bcrypt itself compares in constant time. Results are
//! cached by a SHA-256 of (user, hash, password), so a scrape every second costs one bcrypt
//! per distinct attempt, and bcrypts run one at a time off the runtime's thread.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use anyhow::Result;
use base64::{Engine as _, engine::general_purpose::STANDARD};
use hyper::header::{AUTHORIZATION, HeaderMap};
use ring::digest::{SHA256, digest};

/// Distinct attempts remembered; past that the cache starts again (a flood of guesses cannot
/// grow it).
const CACHE_ENTRIES: usize = 1024;

pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// Checked when the user is unknown: same cost as the real ones.
    decoy: String,
    /// SHA-256 of (user, hash, password) -> allowed. Also serialises bcrypt.
    cache: Arc<Mutex<HashMap<[u8; 32], bool>>>,
}

impl BasicAuth {
    /// Checks every hash now, so a typo is an error at start-up, naming the user.
    pub fn new(users: BTreeMap<String, String>) -> Result<Self> {
        // bcrypt's lowest cost; raised to the highest configured.
        let mut cost = 4;
        for (user, hash) in &users {
            let parts: bcrypt::HashParts = hash.parse().map_err(|e| {
                anyhow::anyhow!(
                    "{user}: not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
                )
            })?;
            cost = cost.max(parts.get_cost());
        }
        let decoy = bcrypt::hash("memlock-trace decoy password", cost)?;
        Ok(Self {
            users,
            decoy,
            cache: Arc::default(),
        })
    }

    /// Whether `headers` carry the credentials of a configured user. Blocking (bcrypt):
    /// call it from a blocking thread.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        let Some((user, password)) = credentials(headers) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(hash) => (hash.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        let mut key = Vec::with_capacity(user.len() + hash.len() + password.len() + 2);
        for part in [user.as_bytes(), hash.as_bytes(), password.as_slice()] {
            key.extend_from_slice(part);
            key.push(0);
        }
        let key: [u8; 32] = digest(&SHA256, &key)
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&allowed) = cache.get(&key) {
            return allowed;
        }
        let matches = bcrypt::verify(&password, hash).unwrap_or(false);
        let allowed = known && matches;
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, allowed);
        allowed
    }
}

/// (user, password) of an `Authorization: Basic` header.
fn credentials(headers: &HeaderMap) -> Option<(String, Vec<u8>)> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn headers(user: &str, password: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let value = format!("Basic {}", STANDARD.encode(format!("{user}:{password}")));
        h.insert(AUTHORIZATION, HeaderValue::from_str(&value).unwrap());
        h
    }

    #[test]
    fn right_password_only() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([("prom".to_string(), hash)])).unwrap();
        assert!(auth.allows(&headers("prom", "s3cret")));
        // Cached, still right.
        assert!(auth.allows(&headers("prom", "s3cret")));
        assert!(!auth.allows(&headers("prom", "wrong")));
        assert!(!auth.allows(&headers("nobody", "s3cret")));
        assert!(!auth.allows(&HeaderMap::new()));
        let mut bearer = HeaderMap::new();
        bearer.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert!(!auth.allows(&bearer));
    }

    #[test]
    fn a_bad_hash_names_the_user() {
        let e = BasicAuth::new(BTreeMap::from([("alice".to_string(), "x".to_string())]))
            .err()
            .unwrap();
        assert!(
            format!("{e}").starts_with("alice: not a bcrypt hash"),
            "{e}"
        );
    }
}
