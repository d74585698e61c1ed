package client

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// TestListFollowsCursors: a list method follows next_cursor to the last
// page, keeping the filters on every request; a daemon from before
// paging (a bare array) is one page.
func TestListFollowsCursors(t *testing.T) {
	ids := []string{"sb-1", "sb-2", "sb-3", "sb-4", "sb-5"}
	var queries []string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		queries = append(queries, r.URL.RawQuery)
		if r.URL.Path == "/v1/images" { // an old daemon
			json.NewEncoder(w).Encode([]apiv1.Image{{Digest: "d1"}, {Digest: "d2"}})
			return
		}
		start, _ := strconv.Atoi(q.Get("cursor"))
		end := min(start+2, len(ids)) // the daemon pages by 2, whatever the limit
		page := apiv1.List[apiv1.Sandbox]{Items: []apiv1.Sandbox{}}
		for _, id := range ids[start:end] {
			page.Items = append(page.Items, apiv1.Sandbox{ID: id, Tag: q.Get("tag")})
		}
		if end < len(ids) {
			page.NextCursor = strconv.Itoa(end)
		}
		json.NewEncoder(w).Encode(page)
	})
	sbs, err := c.Sandboxes(context.Background(), "py", "", "team=a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sb := range sbs {
		got = append(got, sb.ID)
		if sb.Tag != "py" {
			t.Errorf("%s: the tag filter was lost on a later page", sb.ID)
		}
	}
	if !slices.Equal(got, ids) {
		t.Errorf("Sandboxes: %v, want %v", got, ids)
	}
	want := []string{"label=team%3Da&limit=1000&tag=py", "cursor=2&label=team%3Da&limit=1000&tag=py", "cursor=4&label=team%3Da&limit=1000&tag=py"}
	if !slices.Equal(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
	imgs, err := c.Images(context.Background())
	if err != nil || len(imgs) != 2 || imgs[1].Digest != "d2" {
		t.Errorf("Images from a daemon before paging: %+v %v", imgs, err)
	}
}

// TestListStopsOnARepeatedCursor: a daemon that answers the same cursor
// again is an error, not an endless loop.
func TestListStopsOnARepeatedCursor(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(apiv1.List[apiv1.Operation]{Items: []apiv1.Operation{{ID: "op-1"}}, NextCursor: "same"})
	})
	if ops, err := c.Operations(context.Background()); err == nil {
		t.Errorf("Operations: %d items and no error, want an error", len(ops))
	}
}
