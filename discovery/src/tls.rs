//! TLS 1.3 with RFC 7250 raw public keys: each node presents its Ed25519
//! public key (as a SubjectPublicKeyInfo) and proves possession by signing the
//! handshake. There are no certificates and no CAs: the key *is* the node id.
//!
//! The client names the node it expects in the TLS server name (the node id's
//! base32 form, a valid DNS label); the verifier refuses any other key.
//! [`ANY_NODE`] as server name accepts any key (used when dialling a bootstrap
//! address whose node id is unknown; admission still applies afterwards).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature_with_raw_key, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer,
    UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::identity::{node_id_from_spki, spki_der, Identity, NodeId};

/// ALPN of the multiplexed starling connection, protocol version 1.
pub const ALPN: &[u8] = b"starling/1";

/// Server name used when the peer's node id is not known in advance.
pub const ANY_NODE: &str = "any-node.starling";

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the configuration.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// quinn refused the rustls configuration.
    #[error("quic crypto: {0}")]
    Quic(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certified_key(identity: &Identity) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(identity.pkcs8_der()));
    let PrivateKeyDer::Pkcs8(pkcs8) = der else {
        unreachable!("constructed as PKCS#8 just above")
    };
    let key = rustls::crypto::ring::sign::any_eddsa_type(&pkcs8)?;
    let spki = CertificateDer::from(spki_der(&identity.node_id()));
    Ok(Arc::new(rustls::sign::CertifiedKey::new(vec![spki], key)))
}

/// The quinn client configuration for this node.
pub fn client_config(
    identity: &Identity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, TlsError> {
    let p = provider();
    let algs = p.signature_verification_algorithms;
    let mut cfg = rustls::ClientConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PeerVerifier { algs }))
        .with_client_cert_resolver(Arc::new(
            rustls::client::AlwaysResolvesClientRawPublicKeys::new(certified_key(identity)?),
        ));
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(cfg)
        .map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    client.transport_config(transport);
    Ok(client)
}

/// The quinn server configuration for this node.
pub fn server_config(
    identity: &Identity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, TlsError> {
    let p = provider();
    let algs = p.signature_verification_algorithms;
    let mut cfg = rustls::ServerConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(PeerVerifier { algs }))
        .with_cert_resolver(Arc::new(
            rustls::server::AlwaysResolvesServerRawPublicKeys::new(certified_key(identity)?),
        ));
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(cfg)
        .map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
    server.transport_config(transport);
    Ok(server)
}

/// The TLS server name that makes the client accept only `expected`.
pub fn server_name_for(expected: Option<&NodeId>) -> String {
    match expected {
        Some(id) => id.to_string(),
        None => ANY_NODE.to_owned(),
    }
}

/// The node id a finished connection's peer authenticated as.
pub fn peer_node_id(conn: &quinn::Connection) -> Option<NodeId> {
    let identity = conn.peer_identity()?;
    let certs = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    let first = certs.first()?;
    node_id_from_spki(first.as_ref())
}

/// Verifies both directions: the peer must present an Ed25519 raw public key
/// and sign the TLS 1.3 handshake with it.
#[derive(Debug)]
struct PeerVerifier {
    algs: WebPkiSupportedAlgorithms,
}

impl PeerVerifier {
    fn verify_sig(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme != SignatureScheme::ED25519 {
            return Err(rustls::Error::PeerIncompatible(
                rustls::PeerIncompatible::NoSignatureSchemesInCommon,
            ));
        }
        let spki = SubjectPublicKeyInfoDer::from(cert.as_ref());
        verify_tls13_signature_with_raw_key(message, &spki, dss, &self.algs)
    }
}

fn bad_key() -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !intermediates.is_empty() {
            return Err(bad_key());
        }
        let got = node_id_from_spki(end_entity.as_ref()).ok_or_else(bad_key)?;
        let ServerName::DnsName(name) = server_name else {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ));
        };
        if name.as_ref() == ANY_NODE {
            return Ok(ServerCertVerified::assertion());
        }
        match name.as_ref().parse::<NodeId>() {
            Ok(expected) if expected == got => Ok(ServerCertVerified::assertion()),
            _ => {
                tracing::debug!(expected = name.as_ref(), got = %got, "peer presented an unexpected node id");
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls13RequiredForQuic,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_sig(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for PeerVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if !intermediates.is_empty() {
            return Err(bad_key());
        }
        node_id_from_spki(end_entity.as_ref()).ok_or_else(bad_key)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls13RequiredForQuic,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_sig(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}
