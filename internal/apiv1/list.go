package apiv1

// List is the answer of every list endpoint (GET /v1/sandboxes,
// /v1/snapshots, /v1/images, /v1/operations, /v1/tenants): one page of
// items in the list's order and, when more follow, the cursor that asks
// for the next page (?cursor=NextCursor, with the same filters). The
// cursor is opaque: it names the last item's place in the order, not an
// offset, so items added or removed between pages neither repeat nor
// skip the others.
type List[T any] struct {
	Items []T `json:"items"`
	// NextCursor is absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Paging bounds of ?limit= on list endpoints.
const (
	ListLimitDefault = 500
	ListLimitMax     = 1000
)
