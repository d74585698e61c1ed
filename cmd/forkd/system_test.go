package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestSystemAndImageCommands(t *testing.T) {
	var mu sync.Mutex
	var prunes []apiv1.PruneRequest
	img := apiv1.Image{Digest: strings.Repeat("cd", 32), Recipe: "old", SizeBytes: 3 << 20}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/system/df", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(apiv1.DiskUsage{Images: apiv1.Usage{Count: 2, Active: 1, SizeBytes: 4 << 20, ReclaimableBytes: 1 << 20},
			OCILayers: apiv1.Usage{Count: 4, Active: 2, SizeBytes: 8 << 20, ReclaimableBytes: 6 << 20}})
	})
	mux.HandleFunc("POST /v1/system/prune", func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.PruneRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		prunes = append(prunes, req)
		mu.Unlock()
		json.NewEncoder(w).Encode(apiv1.PruneResponse{DryRun: req.DryRun, Sandboxes: []string{"sb-dead"}, Images: []apiv1.Image{img},
			OCILayers: []string{"sha256:" + strings.Repeat("ef", 32)}, ReclaimedBytes: 3 << 20})
	})
	mux.HandleFunc("DELETE /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("ref") == "used" {
			writeProblemJSON(w, apiv1.Problem{Status: http.StatusConflict, Code: "failed_precondition", Detail: "image used by snapshots py"})
			return
		}
		json.NewEncoder(w).Encode(img)
	})
	d := newFakeDaemon(t, mux)

	out, err := runCLI(t, d, "system", "df")
	if err != nil || !strings.Contains(out, "Images") || !strings.Contains(out, "1.0 MiB (25%)") ||
		!strings.Contains(out, "OCI layers (cache)") || !strings.Contains(out, "6.0 MiB (75%)") {
		t.Errorf("df: %v\n%s", err, out)
	}
	out, err = runCLI(t, d, "system", "prune", "--images", "--dry-run")
	if err != nil || !strings.Contains(out, "would remove dead sandbox sb-dead") ||
		!strings.Contains(out, "would remove OCI layer efefefefefef") || !strings.Contains(out, "would free 3.0 MiB") {
		t.Errorf("dry run: %v\n%s", err, out)
	}
	if len(prunes) != 1 || !prunes[0].DryRun || !prunes[0].Images {
		t.Fatalf("dry run sent %+v", prunes)
	}
	// Not a terminal: no question; the plan, then the prune.
	out, err = runCLI(t, d, "system", "prune")
	if err != nil || !strings.Contains(out, "removed image cdcdcdcdcdcd (recipe old") || !strings.Contains(out, "freed 3.0 MiB") {
		t.Errorf("prune: %v\n%s", err, out)
	}
	if len(prunes) != 3 || !prunes[1].DryRun || prunes[2].DryRun || prunes[2].Images {
		t.Errorf("prune sent %+v", prunes)
	}
	if !confirm(strings.NewReader("y\n"), new(strings.Builder), "?") || confirm(strings.NewReader("\n"), new(strings.Builder), "?") {
		t.Error("confirm: y is yes, nothing is no")
	}

	out, err = runCLI(t, d, "image", "rm", "old")
	if err != nil || !strings.Contains(out, "removed image cdcdcdcdcdcd") {
		t.Errorf("image rm: %v %q", err, out)
	}
	if _, err := runCLI(t, d, "image", "rm", "used"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "py") || exitCodeOf(err) != 1 {
		t.Errorf("image rm of a used image: %v", err)
	}
}
