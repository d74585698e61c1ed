package metrics

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Label cardinality. Every label's values come from a bounded set:
//
//   - tag (forkd_fork_ready_seconds, forkd_pooled_vmms): a template's tag,
//     or BranchTag for every snapshot taken of a running sandbox (SDKs
//     name branches <tag>-br-<random>, one tag per branch); templates are
//     made by `forkd snapshot create` or imported, so they are few, and
//     past MaxTags of them the rest are reported as "other".
//   - route (forkd_http_request_duration_seconds): the ServeMux pattern,
//     never the raw path (api.Instrument), past MaxRoutes "other".
//   - method: the nine standard HTTP methods, else "other".
//   - code (HTTP): a status code net/http can send, three digits.
//   - op (forkd_agent_rpc_*): the agent API's method and path, past MaxOps
//     "other".
//   - code, result (error classes): errdefs class codes (errorClass), never
//     error texts.
//   - phase, mode, state, dir: small fixed sets named in this package,
//     internal/sandbox and apiv1.
//   - version, go_version (forkd_build_info): one value per process.
//
// Tenants, sandbox ids, image digests, file names and error messages are
// never label values.

// BranchTag is the tag label of every snapshot taken of a running sandbox
// (a branch, whatever its tag, and what is compacted or imported from one).
// Tags start with a letter or digit, so no template's tag is this.
const BranchTag = "_branch"

// Bounds on distinct label values; values past them are reported as
// "other". They are far above what forkd produces and only guard against a
// caller passing unbounded values (raw paths, file names, many templates).
const (
	MaxRoutes = 200 // route of forkd_http_request_duration_seconds
	MaxOps    = 100 // op of forkd_agent_rpc_*
	MaxTags   = 100 // tag of forkd_fork_ready_seconds and forkd_pooled_vmms
)

// labelSet admits the first max distinct values of a label.
type labelSet struct {
	seen sync.Map // value -> struct{}
	n    atomic.Int64
}

func (l *labelSet) admit(v string, max int64) string {
	if _, ok := l.seen.Load(v); ok {
		return v
	}
	if l.n.Add(1) > max {
		l.n.Add(-1)
		return "other"
	}
	if _, loaded := l.seen.LoadOrStore(v, struct{}{}); loaded {
		l.n.Add(-1)
	}
	return v
}

func boundMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// errorClass is the errdefs class code of err. An error of no class that
// ends in a context's cancellation or deadline is canceled or
// deadline_exceeded, not internal: a client that went away is no daemon
// failure.
func errorClass(err error) string {
	code := errdefs.Code(err)
	switch {
	case code != "internal" || errors.Is(err, errdefs.ErrInternal):
		return code
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return code
}
