package pack

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func keyPair(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(priv.Public()) {
		t.Fatal("public key does not belong to the private key")
	}
	again, err := ParsePublicKey([]byte(EncodePublicKey(pub) + "\n"))
	if err != nil || !again.Equal(pub) {
		t.Fatalf("compact public key: %v", err)
	}
	return priv, pub
}

func TestKeys(t *testing.T) {
	priv, pub := keyPair(t)
	if _, err := ParsePrivateKey([]byte("nope")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("garbage private key: %v", err)
	}
	pubPEM, _, _ := GenerateKey()
	if _, err := ParsePublicKey(pubPEM); !errdefs.IsInvalidArgument(err) { // a private key where a public one goes
		t.Errorf("private key as public key: %v", err)
	}
	if _, err := ParsePublicKey([]byte("AAAA")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("short public key: %v", err)
	}
	if fp := Fingerprint(pub); !strings.HasPrefix(fp, "SHA256:") || fp == Fingerprint(priv.Public().(ed25519.PublicKey)[:0]) {
		t.Errorf("fingerprint %q", fp)
	}
}

func unpackErr(t *testing.T, archive []byte, opts UnpackOptions) error {
	t.Helper()
	dst := t.TempDir()
	_, _, err := Unpack(context.Background(), dst, bytes.NewReader(archive), opts)
	if err != nil {
		assertClean(t, dst, nil, nil)
	}
	return err
}

func TestSignedArchives(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	priv, pub := keyPair(t)
	otherPriv, otherPub := keyPair(t)

	signed, st := packBytes(t, src, "base", PackOptions{SignKey: priv})
	if !st.Signed {
		t.Error("stats say unsigned")
	}
	dst := t.TempDir()
	_, ust, err := Unpack(context.Background(), dst, bytes.NewReader(signed), UnpackOptions{VerifyKey: pub})
	if err != nil {
		t.Fatalf("signed archive with the right key: %v", err)
	}
	if !ust.Signed || !ust.Verified {
		t.Errorf("stats %+v", ust)
	}
	// Without a key, a signed archive unpacks like any other.
	if err := unpackErr(t, signed, UnpackOptions{}); err != nil {
		t.Errorf("signed archive without verification: %v", err)
	}

	unsigned, _ := packBytes(t, src, "base", PackOptions{})
	for _, c := range []struct {
		name    string
		archive []byte
		key     ed25519.PublicKey
		want    string
	}{
		{"unsigned", unsigned, pub, "not signed"},
		{"wrong key", signed, otherPub, "signed by key " + Fingerprint(pub)},
		{"tampered manifest", encode(t, editManifest(t, decode(t, signed), func(m *Manifest) { m.Snapshots[0].Manifest.VCPUs = 64 })), pub, "altered"},
		{"signature of another archive", func() []byte {
			e := decode(t, signed)
			src2, _ := makeDataDir(t, "other", 16*mib)
			o := decode(t, packBytesSigned(t, src2, "other", otherPriv))
			e[1] = o[1]
			return encode(t, e)
		}(), otherPub, "altered"},
		{"signature not second", func() []byte {
			e := decode(t, signed)
			e[1], e[2] = e[2], e[1]
			return encode(t, e)
		}(), pub, "not signed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := unpackErr(t, c.archive, UnpackOptions{VerifyKey: c.key})
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want InvalidArgument containing %q", err, c.want)
			}
		})
	}

	// Sign adds a signature to an unsigned archive and replaces one.
	var resigned bytes.Buffer
	if err := Sign(bytes.NewReader(unsigned), &resigned, priv); err != nil {
		t.Fatal(err)
	}
	if err := unpackErr(t, resigned.Bytes(), UnpackOptions{VerifyKey: pub}); err != nil {
		t.Errorf("archive signed by Sign: %v", err)
	}
	var swapped bytes.Buffer
	if err := Sign(bytes.NewReader(resigned.Bytes()), &swapped, otherPriv); err != nil {
		t.Fatal(err)
	}
	if err := unpackErr(t, swapped.Bytes(), UnpackOptions{VerifyKey: otherPub}); err != nil {
		t.Errorf("re-signed archive: %v", err)
	}
	if err := unpackErr(t, swapped.Bytes(), UnpackOptions{VerifyKey: pub}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("re-signed archive with the old key: %v", err)
	}
	if err := Sign(bytes.NewReader(encode(t, decode(t, unsigned))), &bytes.Buffer{}, priv); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Sign of an archive without the header frame: %v", err)
	}
	if err := Sign(strings.NewReader("hello"), &bytes.Buffer{}, priv); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Sign of garbage: %v", err)
	}
}

func packBytesSigned(t *testing.T, src, tag string, key ed25519.PrivateKey) []byte {
	b, _ := packBytes(t, src, tag, PackOptions{SignKey: key})
	return b
}

// TestTrustedKeys: with the daemon's import policy, only archives signed
// by one of its keys unpack (403 otherwise), whatever the client asks.
func TestTrustedKeys(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	priv, pub := keyPair(t)
	otherPriv, otherPub := keyPair(t)
	_, thirdPub := keyPair(t)
	trusted := []ed25519.PublicKey{thirdPub, pub}

	signed := packBytesSigned(t, src, "base", priv)
	if err := unpackErr(t, signed, UnpackOptions{TrustedKeys: trusted}); err != nil {
		t.Errorf("signed by the second trusted key: %v", err)
	}
	unsigned, _ := packBytes(t, src, "base", PackOptions{})
	byOther := packBytesSigned(t, src, "base", otherPriv)
	for _, c := range []struct {
		name    string
		archive []byte
		opts    UnpackOptions
		want    string
	}{
		{"unsigned", unsigned, UnpackOptions{TrustedKeys: trusted}, "not signed"},
		{"signed by another key", byOther, UnpackOptions{TrustedKeys: trusted}, "signed by key " + Fingerprint(otherPub)},
		{"the client's own key does not override the policy", byOther, UnpackOptions{TrustedKeys: trusted, VerifyKey: otherPub}, "trusts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := unpackErr(t, c.archive, c.opts)
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--trusted-keys") {
				t.Errorf("got %v, want PermissionDenied containing %q and the fix", err, c.want)
			}
		})
	}
	// Signed by a trusted key, then altered: refused as altered.
	tampered := encode(t, editManifest(t, decode(t, signed), func(m *Manifest) { m.Snapshots[0].Manifest.VCPUs = 64 }))
	if err := unpackErr(t, tampered, UnpackOptions{TrustedKeys: trusted}); err == nil || !strings.Contains(err.Error(), "altered") {
		t.Errorf("tampered archive of a trusted key: %v", err)
	}
}
