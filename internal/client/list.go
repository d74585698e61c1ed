package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// maxListPages bounds how many pages listAll follows (of up to
// apiv1.ListLimitMax items each): a daemon whose cursors never end is an
// error, not a client that hangs.
const maxListPages = 10_000

// ListPage fetches one page of a list endpoint (path: "/v1/sandboxes",
// "/v1/snapshots", "/v1/images", "/v1/operations" or "/v1/tenants"), with
// the filters in q, up to limit items (0: the daemon's default), after
// cursor (empty: the first page; else an earlier page's NextCursor, with
// the same filters). A daemon from before paging answers the whole list
// as one page.
func ListPage[T any](ctx context.Context, c *Client, path string, q url.Values, limit int, cursor string) (apiv1.List[T], error) {
	qq := url.Values{}
	for k, v := range q {
		qq[k] = v
	}
	if limit > 0 {
		qq.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		qq.Set("cursor", cursor)
	}
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodGet, path, qq, nil, &raw); err != nil {
		return apiv1.List[T]{}, err
	}
	var out apiv1.List[T]
	var err error
	if b := bytes.TrimSpace(raw); len(b) > 0 && b[0] == '[' {
		err = json.Unmarshal(b, &out.Items) // a bare array: a daemon from before paging
	} else {
		err = json.Unmarshal(raw, &out)
	}
	if err != nil {
		return apiv1.List[T]{}, fmt.Errorf("decode GET %s response: %w", path, err)
	}
	return out, nil
}

// listAll fetches every page of a list endpoint, in the list's order.
func listAll[T any](ctx context.Context, c *Client, path string, q url.Values) ([]T, error) {
	out := []T{} // [], not null, when there is none
	cursor := ""
	for range maxListPages {
		page, err := ListPage[T](ctx, c, path, q, apiv1.ListLimitMax, cursor)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if page.NextCursor == "" {
			return out, nil
		}
		if page.NextCursor == cursor {
			return nil, fmt.Errorf("GET %s: the daemon answered the same next_cursor twice; its paging is broken", path)
		}
		cursor = page.NextCursor
	}
	return nil, fmt.Errorf("GET %s: more than %d pages; list with filters, or a page at a time (ListPage)", path, maxListPages)
}
