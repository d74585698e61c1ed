package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Paging of the list endpoints. Each list is sorted by a key of its own
// (listOrder); a page holds up to ?limit= items after the key its
// ?cursor= names, and its next_cursor is its last item's key, encoded.
// Keyed, not counted: items added or removed between two pages neither
// repeat nor skip the others. The items are those the caller may see,
// filters applied, before paging: a tenant's cursors and pages say
// nothing about other tenants' items.

// maxCursorLen bounds ?cursor=: the longest key (a time and an ID or a
// tag) encodes far shorter.
const maxCursorLen = 1024

// listOrder is the order of one list: its items sorted by key, compared
// with cmp. Keys are unique within a list (an ID, a tag, a name).
type listOrder[T, K any] struct {
	key func(T) K
	cmp func(a, b K) int
}

// writePage answers one page of items, ordered by ord, for r's ?limit=
// and ?cursor= (apiv1.List); a bad limit or cursor is a 400.
func writePage[T, K any](w http.ResponseWriter, r *http.Request, items []T, ord listOrder[T, K]) {
	out, err := pageOf(r.URL.Query(), items, ord)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, out)
}

// pageOf sorts items by ord (in place) and returns the page q asks for.
func pageOf[T, K any](q url.Values, items []T, ord listOrder[T, K]) (apiv1.List[T], error) {
	limit := apiv1.ListLimitDefault
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > apiv1.ListLimitMax {
			return apiv1.List[T]{}, fmt.Errorf("limit %q: want a whole number from 1 to %d (default %d): %w",
				s, apiv1.ListLimitMax, apiv1.ListLimitDefault, errdefs.ErrInvalidArgument)
		}
		limit = n
	}
	cmpItem := func(a T, k K) int { return ord.cmp(ord.key(a), k) }
	slices.SortStableFunc(items, func(a, b T) int { return cmpItem(a, ord.key(b)) })
	start := 0
	if c := q.Get("cursor"); c != "" {
		after, err := decodeCursor[K](c)
		if err != nil {
			return apiv1.List[T]{}, err
		}
		i, found := slices.BinarySearchFunc(items, after, cmpItem)
		if found {
			i++
		}
		start = i
	}
	end := min(len(items), start+limit)
	out := apiv1.List[T]{Items: append(make([]T, 0, end-start), items[start:end]...)}
	if end < len(items) {
		out.NextCursor = encodeCursor(ord.key(items[end-1]))
	}
	return out, nil
}

// encodeCursor makes k a cursor: base64url of its JSON, opaque to
// clients.
func encodeCursor[K any](k K) string {
	b, _ := json.Marshal(k)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor[K any](c string) (K, error) {
	var k K
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil && len(c) <= maxCursorLen {
		err = decodeStrictJSON(b, &k)
	}
	if err != nil || len(c) > maxCursorLen {
		return k, fmt.Errorf("cursor %.40q is not one this list gave (next_cursor of an earlier page, same filters): list again without cursor to start over: %w",
			c, errdefs.ErrInvalidArgument)
	}
	return k, nil
}

// createdKey orders items by creation time, then ID. The time is kept
// to the nanosecond, without its monotonic reading, so a decoded cursor
// compares as the item it came from.
type createdKey struct {
	Created time.Time `json:"c"`
	ID      string    `json:"id"`
}

func keyCreated(created time.Time, id string) createdKey {
	return createdKey{Created: created.Round(0).UTC(), ID: id}
}

func cmpCreated(a, b createdKey) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// The lists' orders.
var (
	// Sandboxes: oldest first, as Engine.List.
	sandboxOrder = listOrder[apiv1.Sandbox, createdKey]{
		key: func(s apiv1.Sandbox) createdKey { return keyCreated(s.Created, s.ID) },
		cmp: cmpCreated,
	}
	// Operations: oldest first.
	operationOrder = listOrder[apiv1.Operation, createdKey]{
		key: func(o apiv1.Operation) createdKey { return keyCreated(o.Created, o.ID) },
		cmp: cmpCreated,
	}
	// Images: newest first.
	imageOrder = listOrder[apiv1.Image, createdKey]{
		key: func(i apiv1.Image) createdKey { return keyCreated(i.Created, i.Digest) },
		cmp: func(a, b createdKey) int { return cmpCreated(b, a) },
	}
	// Snapshots: by tag, those being written among the committed ones (a
	// tag keeps its place when it commits).
	snapshotOrder = listOrder[apiv1.Snapshot, string]{
		key: func(s apiv1.Snapshot) string { return s.Tag },
		cmp: strings.Compare,
	}
	// Tenants: the default tenant first, then by name.
	tenantOrder = listOrder[apiv1.Tenant, string]{
		key: func(t apiv1.Tenant) string { return t.Name },
		cmp: func(a, b string) int {
			if (a == auth.DefaultTenant) != (b == auth.DefaultTenant) {
				if a == auth.DefaultTenant {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		},
	}
)
