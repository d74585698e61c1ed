package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/state"
)

// Idempotency keys (Idempotency-Key, as in the IETF httpapi draft and
// Stripe): a POST /v1/sandboxes, /v1/snapshots or /v1/images sent again
// with the key of an earlier one, by the same tenant to the same route
// with the same body, gets the first one's answer (Idempotent-Replayed:
// true) instead of forking, or building, twice; a long operation's retry
// gets the same operation, running or finished. The same key with another
// body is 422; a retry while the first request still runs (a fork) is 409.
// A key records an answer only once the work was done or started: a
// request that was refused or failed leaves it free, so the retry does
// the work. Keys are kept idempotencyRetention (at most maxIdempotencyKeys,
// the oldest dropped first), in the state file when the daemon has one:
// a retry across a daemon restart is still recognised.
const (
	maxIdempotencyKeyLen = 255
	idempotencyRetention = 24 * time.Hour
	maxIdempotencyKeys   = 4096
)

// idempotency holds the keys' records.
type idempotency struct {
	store *state.Store

	// mu guards the fields below.
	mu sync.Mutex
	// recs are the keys that recorded an answer, by record ID.
	recs map[string]*state.IdempotencyRecord
	// inflight are the fingerprints of keys whose first request runs.
	inflight map[string]string
}

// load reads the keys an earlier daemon recorded.
func (k *idempotency) load(store *state.Store) error {
	k.store = store
	recs, err := store.Idempotency()
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.init()
	for i := range recs {
		k.recs[recs[i].ID] = &recs[i]
	}
	k.pruneLocked(time.Now())
	return nil
}

func (k *idempotency) init() {
	if k.recs == nil {
		k.recs, k.inflight = map[string]*state.IdempotencyRecord{}, map[string]string{}
	}
}

// pruneLocked drops the records past retention and, beyond the bound, the
// oldest.
func (k *idempotency) pruneLocked(now time.Time) {
	var gone []string
	var all []*state.IdempotencyRecord
	for id, rec := range k.recs {
		if now.Sub(rec.Created) > idempotencyRetention {
			gone = append(gone, id)
			delete(k.recs, id)
			continue
		}
		all = append(all, rec)
	}
	if extra := len(all) - (maxIdempotencyKeys - 1); extra > 0 {
		sort.Slice(all, func(i, j int) bool { return all[i].Created.Before(all[j].Created) })
		for _, rec := range all[:extra] {
			gone = append(gone, rec.ID)
			delete(k.recs, rec.ID)
		}
	}
	if len(gone) > 0 && k.store != nil {
		k.store.DeleteIdempotency(gone...)
	}
}

// idemClaim is a request's hold on its key until it records an answer.
// A nil claim (no key) does nothing.
type idemClaim struct {
	k       *idempotency
	rec     state.IdempotencyRecord
	settled bool
}

// result records the answer a replay repeats.
func (c *idemClaim) result(status int, body []byte) {
	if c != nil {
		c.rec.Status, c.rec.Body = status, body
		c.settle(true)
	}
}

// writeRecorded answers status with v as JSON, and records the answer on
// claim (nil: no key) for a replay to repeat.
func writeRecorded(w http.ResponseWriter, r *http.Request, claim *idemClaim, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	body = append(body, '\n')
	claim.result(status, body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

// operation records the operation a replay follows.
func (c *idemClaim) operation(id string) {
	if c != nil {
		c.rec.Operation = id
		c.settle(true)
	}
}

// release frees the key (the request did no work): deferred by handlers,
// a no-op once an answer is recorded.
func (c *idemClaim) release() {
	if c != nil {
		c.settle(false)
	}
}

func (c *idemClaim) settle(keep bool) {
	if c.settled {
		return
	}
	c.settled = true
	k := c.k
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.inflight, c.rec.ID)
	if !keep {
		return
	}
	rec := c.rec
	k.recs[rec.ID] = &rec
	if k.store != nil {
		// Best effort: without the record a retry after a restart does
		// the work again, as it would without a key.
		k.store.PutIdempotency(rec)
	}
}

// checkIdempotencyKey bounds a key: 1 to 255 visible ASCII characters.
func checkIdempotencyKey(key string) error {
	if len(key) == 0 || len(key) > maxIdempotencyKeyLen {
		return fmt.Errorf("%s of %d bytes: want 1 to %d: %w", apiv1.IdempotencyKeyHeader, len(key), maxIdempotencyKeyLen, errdefs.ErrInvalidArgument)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("%s: byte %d is %#x: want printable ASCII (a UUID is a good key): %w", apiv1.IdempotencyKeyHeader, i, key[i], errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// claimIdempotency is idempotent for a handler: ok false means r has
// been answered (a replay, or the problem), and the handler returns.
func (s *Server) claimIdempotency(w http.ResponseWriter, r *http.Request, req any, replayOp func(opID string)) (_ *idemClaim, ok bool) {
	claim, replayed, err := s.idempotent(w, r, req, replayOp)
	if err != nil {
		writeProblem(w, r, err)
		return nil, false
	}
	return claim, !replayed
}

// idempotent handles r's Idempotency-Key, req being its decoded body.
// Without a key it returns a nil claim. For a key seen before with the
// same request it answers the replay (replayOp answers a recorded
// operation) and returns replayed; with another request, or while the
// first still runs, an error. Otherwise it claims the key: the handler
// records its answer on the claim, and defers release.
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, req any, replayOp func(opID string)) (_ *idemClaim, replayed bool, _ error) {
	key := r.Header.Get(apiv1.IdempotencyKeyHeader)
	if key == "" {
		return nil, false, nil
	}
	if err := checkIdempotencyKey(key); err != nil {
		return nil, false, err
	}
	route := r.Method + " " + r.URL.Path
	body, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	sum := sha256.Sum256(append([]byte(route+"\n"), body...))
	fp := hex.EncodeToString(sum[:])
	id := auth.TenantOf(s.principalOf(r).Tenant) + "\n" + route + "\n" + key

	k := &s.idem
	k.mu.Lock()
	k.init()
	now := time.Now()
	k.pruneLocked(now)
	rec, done := k.recs[id]
	inflightFP, running := k.inflight[id]
	if !done && !running {
		k.inflight[id] = fp
	}
	k.mu.Unlock()
	switch {
	case done && rec.Fingerprint != fp, running && inflightFP != fp:
		return nil, false, withStatus(http.StatusUnprocessableEntity, fmt.Errorf(
			"%s %q was first used with another request to %s; send a new key for a new request: %w", apiv1.IdempotencyKeyHeader, key, route, errdefs.ErrInvalidArgument))
	case running:
		return nil, false, fmt.Errorf("the first request with %s %q to %s is still running; retry once it has answered: %w",
			apiv1.IdempotencyKeyHeader, key, route, errdefs.ErrFailedPrecondition)
	case done:
		if rec.Operation != "" {
			if _, ok := s.ops.get(rec.Operation); !ok {
				return nil, false, fmt.Errorf("%s %q started operation %s, which is no longer kept; send a new key to do the work again: %w",
					apiv1.IdempotencyKeyHeader, key, rec.Operation, errdefs.ErrFailedPrecondition)
			}
			w.Header().Set(apiv1.IdempotentReplayedHeader, "true")
			replayOp(rec.Operation)
			return nil, true, nil
		}
		w.Header().Set(apiv1.IdempotentReplayedHeader, "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Status)
		w.Write(rec.Body)
		return nil, true, nil
	}
	return &idemClaim{k: k, rec: state.IdempotencyRecord{ID: id, Fingerprint: fp, Created: now.UTC()}}, false, nil
}
