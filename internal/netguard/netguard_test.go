package netguard

import (
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// PublicOnly refuses every address that is not a public unicast one;
// the check runs on the address dialled, so no traffic is sent here.
func TestPublicOnlyRefusesPrivateAddresses(t *testing.T) {
	for _, addr := range []string{
		"127.0.0.1:5000", "[::1]:443", "10.1.2.3:443", "172.16.0.1:443", "192.168.1.1:443",
		"169.254.169.254:80", "[fe80::1]:443", "0.0.0.0:443", "[::]:443", "100.64.0.1:443",
		"198.18.0.1:443", "224.0.0.1:443", "[fd00::1]:443", "not-an-address",
	} {
		err := PublicOnly("tcp", addr, nil)
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("%s: %v, want permission_denied", addr, err)
		}
	}
	for _, addr := range []string{"198.51.100.7:443", "[2001:db8::1]:443", "203.0.113.9:5000"} {
		if err := PublicOnly("tcp", addr, nil); err != nil {
			t.Errorf("%s: %v, want allowed", addr, err)
		}
	}
}
