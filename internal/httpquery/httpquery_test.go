package httpquery

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestBool(t *testing.T) {
	for _, c := range []struct {
		query string
		def   bool
		want  bool
	}{
		{"", false, false}, {"", true, true}, {"close=", true, true},
		{"close=1", false, true}, {"close=true", false, true}, {"close=TRUE", false, true},
		{"close=0", true, false}, {"close=false", true, false}, {"other=1", false, false},
	} {
		q, _ := url.ParseQuery(c.query)
		if got, err := Bool(q, "close", c.def); err != nil || got != c.want {
			t.Errorf("%q (default %v) = %v, %v; want %v", c.query, c.def, got, err, c.want)
		}
	}
	q, _ := url.ParseQuery("close=yes")
	_, err := Bool(q, "close", true)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `close="yes"`) {
		t.Errorf("close=yes: %v", err)
	}
}
