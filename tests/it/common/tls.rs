//! Certificates made in the test (rcgen): a CA, and leaves it signs, written
//! to a directory of the test's own that is removed when dropped.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub dir: PathBuf,
}

/// A leaf's files.
pub struct Leaf {
    pub cert_file: String,
    pub key_file: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("dltest {name} CA"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = std::env::temp_dir().join(format!("dltest-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = TestCa { issuer, dir };
        ca.write(&format!("{name}-ca.pem"), &ca.pem());
        ca
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn ca_file(&self) -> String {
        let file = self.dir.join("ca.pem");
        std::fs::write(&file, self.pem()).unwrap();
        file.display().to_string()
    }

    /// A certificate for `common_name`, valid for `names` (host names or IPs).
    pub fn issue(&self, leaf: &str, common_name: &str, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key_pem = key.serialize_pem();
        Leaf {
            cert_file: self.write(&format!("{leaf}.pem"), &cert.pem()),
            key_file: self.write(&format!("{leaf}.key"), &key_pem),
            key_pem,
        }
    }

    pub fn write(&self, name: &str, content: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An HTTP client that trusts `ca` alone.
pub fn client_trusting(ca: &TestCa) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .build()
        .unwrap()
}
