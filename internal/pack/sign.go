package pack

import (
	"archive/tar"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// signContext is prefixed to the manifest before signing, so that a
// signature made for an archive means nothing anywhere else.
const signContext = "forkd-archive-manifest-v1\x00"

// signature is forkd-archive.sig. Only Signature is trusted; Key says
// which key signed, for error messages.
type signature struct {
	Algorithm string `json:"algorithm"`
	Key       []byte `json:"key"`
	Signature []byte `json:"signature"`
}

func signManifest(key ed25519.PrivateKey, manifest []byte) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("signing key: %d bytes, want an ed25519 private key: %w", len(key), errdefs.ErrInvalidArgument)
	}
	msg := append([]byte(signContext), manifest...)
	return json.Marshal(signature{
		Algorithm: "ed25519",
		Key:       key.Public().(ed25519.PublicKey),
		Signature: ed25519.Sign(key, msg),
	})
}

// verifyManifest checks the signature entry sig (nil if the archive has
// none) of manifest against key.
func verifyManifest(key ed25519.PublicKey, manifest, sig []byte) error {
	if len(key) != ed25519.PublicKeySize {
		return fmt.Errorf("verify key: %d bytes, want an ed25519 public key: %w", len(key), errdefs.ErrInvalidArgument)
	}
	if sig == nil {
		return fmt.Errorf("archive is not signed, and verification with key %s was requested: %w", Fingerprint(key), errdefs.ErrInvalidArgument)
	}
	var s signature
	if err := json.Unmarshal(sig, &s); err != nil || s.Algorithm != "ed25519" || len(s.Signature) != ed25519.SignatureSize {
		return fmt.Errorf("archive signature is malformed: %w", errdefs.ErrInvalidArgument)
	}
	if !ed25519.Verify(key, append([]byte(signContext), manifest...), s.Signature) {
		by := "an unknown key"
		if len(s.Key) == ed25519.PublicKeySize {
			by = "key " + Fingerprint(s.Key)
		}
		if bytes.Equal(s.Key, key) {
			return fmt.Errorf("archive signature does not match its manifest (the archive was altered after signing): %w", errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("archive is signed by %s, not by the verify key %s: %w", by, Fingerprint(key), errdefs.ErrInvalidArgument)
	}
	return nil
}

// verifyTrusted checks the import policy: the manifest is signed by one
// of keys.
func verifyTrusted(keys []ed25519.PublicKey, manifest, sig []byte) error {
	fix := "sign it with `forkd pack --sign KEY` using a key whose .pub the operator trusts (`forkd serve --trusted-keys`)"
	if sig == nil {
		return fmt.Errorf("this daemon imports only archives signed by a key it trusts (%d configured), and this one is not signed; %s: %w", len(keys), fix, errdefs.ErrPermissionDenied)
	}
	for _, k := range keys {
		if verifyManifest(k, manifest, sig) == nil {
			return nil
		}
	}
	var s signature
	by := "an unknown key"
	if json.Unmarshal(sig, &s) == nil && len(s.Key) == ed25519.PublicKeySize {
		by = "key " + Fingerprint(s.Key)
		for _, k := range keys {
			if bytes.Equal(k, s.Key) {
				// A trusted key, but the signature does not hold: why.
				return verifyManifest(k, manifest, sig)
			}
		}
	}
	return fmt.Errorf("this daemon imports only archives signed by a key it trusts (%d configured), and this one is signed by %s; %s: %w", len(keys), by, fix, errdefs.ErrPermissionDenied)
}

// Fingerprint names a public key the way ssh does: SHA256:<base64>.
func Fingerprint(key ed25519.PublicKey) string {
	sum := sha256.Sum256(key)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// GenerateKey makes a signing key pair, PEM-encoded: the private key as
// PKCS #8, the public key as PKIX (both readable by openssl).
func GenerateKey() (privatePEM, publicPEM []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	pder, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), nil
}

// ParsePrivateKey reads a PEM PKCS #8 ed25519 private key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("not a PEM \"PRIVATE KEY\" (make one with `forkd pack keygen`): %w", errdefs.ErrInvalidArgument)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("private key: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %T, want ed25519: %w", k, errdefs.ErrInvalidArgument)
	}
	return priv, nil
}

// ParsePublicKey reads a PEM PKIX ed25519 public key, or the base64 of
// its 32 bytes (as the API's verify_key parameter carries it).
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	if b, _ := pem.Decode(data); b != nil {
		if b.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("PEM block %q, want \"PUBLIC KEY\": %w", b.Type, errdefs.ErrInvalidArgument)
		}
		k, err := x509.ParsePKIXPublicKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("public key: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("public key is %T, want ed25519: %w", k, errdefs.ErrInvalidArgument)
		}
		return pub, nil
	}
	s := string(bytes.TrimSpace(data))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err := enc.DecodeString(s); err == nil && len(raw) == ed25519.PublicKeySize {
			return ed25519.PublicKey(raw), nil
		}
	}
	return nil, fmt.Errorf("not an ed25519 public key (PEM \"PUBLIC KEY\" or base64 of 32 bytes): %w", errdefs.ErrInvalidArgument)
}

// EncodePublicKey is the compact form ParsePublicKey reads: base64url of
// the key's 32 bytes.
func EncodePublicKey(key ed25519.PublicKey) string { return base64.RawURLEncoding.EncodeToString(key) }

// Sign copies an archive from r to w with a signature of its manifest by
// key, replacing any signature it had. It decompresses only the manifest
// frame and copies the rest as is, so it runs at the speed of the copy.
func Sign(r io.Reader, w io.Writer, key ed25519.PrivateKey) error {
	hb := make([]byte, headerSize)
	if _, err := io.ReadFull(r, hb); err != nil {
		return fmt.Errorf("read archive header: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	hdr, err := parseFrameHeader(hb)
	if err != nil {
		return err
	}
	if hdr.manifestLen > maxManifestBytes+(1<<20) || hdr.signatureLen > maxSignatureBytes+(64<<10) {
		return fmt.Errorf("archive header claims a %d-byte manifest frame: %w", hdr.manifestLen, errdefs.ErrInvalidArgument)
	}
	frame := make([]byte, hdr.manifestLen)
	if _, err := io.ReadFull(r, frame); err != nil {
		return fmt.Errorf("read archive manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	manifest, mtime, err := manifestFromFrame(frame)
	if err != nil {
		return err
	}
	if _, err := parseManifest(manifest); err != nil {
		return fmt.Errorf("refusing to sign: %w", err)
	}
	if _, err := io.CopyN(io.Discard, r, int64(hdr.signatureLen)); err != nil {
		return fmt.Errorf("read archive signature: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	sig, err := signManifest(key, manifest)
	if err != nil {
		return err
	}
	sigFrame, err := entryFrame(SignatureName, sig, mtime)
	if err != nil {
		return err
	}
	hdr.signatureLen = uint64(len(sigFrame))
	for _, b := range [][]byte{hdr.marshal(), frame, sigFrame} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	_, err = io.Copy(w, r)
	return err
}

// manifestFromFrame decodes the manifest frame: one tar entry.
func manifestFromFrame(frame []byte) ([]byte, time.Time, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxManifestBytes+(64<<10)))
	if err != nil {
		return nil, time.Time{}, err
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(frame, nil)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("archive manifest frame: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	h, err := tr.Next()
	if err != nil || h.Name != ManifestName || h.Typeflag != tar.TypeReg || h.Size > maxManifestBytes {
		return nil, time.Time{}, fmt.Errorf("archive manifest frame does not hold %s: %w", ManifestName, errdefs.ErrInvalidArgument)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("archive manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		return nil, time.Time{}, fmt.Errorf("archive manifest frame holds more than %s: %w", ManifestName, errdefs.ErrInvalidArgument)
	}
	return data, h.ModTime, nil
}
