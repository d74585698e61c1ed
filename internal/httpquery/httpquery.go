// Package httpquery parses query parameters the same way on both of forkd's
// HTTP surfaces: the daemon's API and the guest agent's. A value that does
// not parse is an error naming the parameter, never read as false.
package httpquery

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Bool reads ?name= as a boolean: absent or empty is def; otherwise what
// strconv.ParseBool takes (1, t, true, 0, f, false, in any case).
func Bool(q url.Values, name string, def bool) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query %s=%q: want true or false: %w", name, v, errdefs.ErrInvalidArgument)
	}
	return b, nil
}
