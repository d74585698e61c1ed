package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// digestOf is the image digest addSnapshot gives tag's image.
func digestOf(tag string) string {
	sum := sha256.Sum256([]byte(tag))
	return hex.EncodeToString(sum[:])
}

// TestImageRemoveRefusesUsedImages: an image a snapshot was taken from is
// 409 naming it; an unused one, named by its recipe, goes (admin only),
// audited with its digest.
func TestImageRemoveRefusesUsedImages(t *testing.T) {
	tk := newTenancy(t, nil)
	dataDir := tk.s.Engine.Config().DataDir
	spare, spareDir := addImage(t, dataDir, "spare", "spare")

	a := tk.call("ops", http.MethodDelete, "/v1/images/"+digestOf("a-base"), "", nil)
	if a.status != http.StatusConflict || !strings.Contains(a.p.Detail, "a-base") {
		t.Fatalf("remove of a used image: %d %s", a.status, a.body)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "images", digestOf("a-base"))); err != nil {
		t.Fatalf("refused removal touched the image: %v", err)
	}
	if a := tk.call("alice", http.MethodDelete, "/v1/images/spare", "", nil); a.status != http.StatusForbidden {
		t.Fatalf("a user removed an image: %d %s", a.status, a.body)
	}
	if a := tk.call("ops", http.MethodDelete, "/v1/images/nope", "", nil); a.status != http.StatusNotFound {
		t.Fatalf("unknown image: %d %s", a.status, a.body)
	}
	var img apiv1.Image
	a = tk.call("ops", http.MethodDelete, "/v1/images/spare", "", nil)
	if a.status != http.StatusOK {
		t.Fatalf("remove by recipe: %d %s", a.status, a.body)
	}
	if err := json.Unmarshal(a.body, &img); err != nil || img.Digest != spare {
		t.Fatalf("removed %+v %v, want %s", img, err, spare)
	}
	if _, err := os.Stat(spareDir); !os.IsNotExist(err) {
		t.Fatalf("image directory still there: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dataDir, "images"))
	for _, e := range ents {
		if strings.Contains(e.Name(), spare[:12]) {
			t.Fatalf("left %s behind", e.Name())
		}
	}
	testutil.WaitFor(t, "the removal's audit record", func() bool {
		for _, r := range auditRecords(t, tk.auditDir)["DELETE /v1/images/{digest}"] {
			if slices.Contains(r.Targets, spare) {
				return true
			}
		}
		return false
	})
}

// TestSystemDFAndPrune: df counts images, snapshots and dead sandboxes
// and what is reclaimable; a dry run changes nothing; a prune forgets
// the dead sandboxes and removes the unused image, never a snapshot.
func TestSystemDFAndPrune(t *testing.T) {
	tk := newTenancy(t, nil)
	dataDir := tk.s.Engine.Config().DataDir
	_, spareDir := addImage(t, dataDir, "spare", "spare")

	if a := tk.call("alice", http.MethodGet, "/v1/system/df", "", nil); a.status != http.StatusForbidden {
		t.Fatalf("a user read df: %d %s", a.status, a.body)
	}
	var du apiv1.DiskUsage
	tk.getJSON("ops", "/v1/system/df", &du)
	if du.Images.Count != 4 || du.Images.Active != 3 || du.Images.ReclaimableBytes <= 0 || du.Images.ReclaimableBytes >= du.Images.SizeBytes {
		t.Errorf("images: %+v", du.Images)
	}
	if du.Snapshots.Count != 3 || du.Snapshots.SizeBytes <= 0 || du.Snapshots.ReclaimableBytes != 0 || du.Layers.Count != 0 {
		t.Errorf("snapshots %+v layers %+v", du.Snapshots, du.Layers)
	}
	if du.Sandboxes.Count != 3 || du.Sandboxes.Active != 0 || du.Pools.Count != 0 {
		t.Errorf("sandboxes %+v pools %+v", du.Sandboxes, du.Pools)
	}

	if a := tk.call("alice", http.MethodPost, "/v1/system/prune", `{}`, nil); a.status != http.StatusForbidden {
		t.Fatalf("a user pruned: %d %s", a.status, a.body)
	}
	var dry apiv1.PruneResponse
	a := tk.call("ops", http.MethodPost, "/v1/system/prune", `{"images":true,"dry_run":true}`, nil)
	if a.status != http.StatusOK || json.Unmarshal(a.body, &dry) != nil {
		t.Fatalf("dry run: %d %s", a.status, a.body)
	}
	if !dry.DryRun || len(dry.Sandboxes) != 3 || len(dry.Images) != 1 || dry.Images[0].Recipe != "spare" || dry.ReclaimedBytes != du.Images.ReclaimableBytes {
		t.Fatalf("dry run answered %+v (df said %+v)", dry, du.Images)
	}
	if _, err := os.Stat(spareDir); err != nil {
		t.Fatalf("a dry run removed the image: %v", err)
	}

	// Without images: only the sandboxes go.
	var res apiv1.PruneResponse
	a = tk.call("ops", http.MethodPost, "/v1/system/prune", `{}`, nil)
	if a.status != http.StatusOK || json.Unmarshal(a.body, &res) != nil || len(res.Sandboxes) != 3 || len(res.Images) != 0 {
		t.Fatalf("prune: %d %s", a.status, a.body)
	}
	var sbs apiv1.List[apiv1.Sandbox]
	tk.getJSON("ops", "/v1/sandboxes", &sbs)
	if len(sbs.Items) != 0 {
		t.Fatalf("prune left sandboxes %+v", sbs.Items)
	}
	a = tk.call("ops", http.MethodPost, "/v1/system/prune", `{"images":true}`, nil)
	if a.status != http.StatusOK || json.Unmarshal(a.body, &res) != nil || len(res.Images) != 1 || res.ReclaimedBytes != dry.ReclaimedBytes {
		t.Fatalf("prune of images: %d %s", a.status, a.body)
	}
	if _, err := os.Stat(spareDir); !os.IsNotExist(err) {
		t.Fatalf("the unused image is still there: %v", err)
	}
	tk.getJSON("ops", "/v1/system/df", &du)
	if du.Images.Count != 3 || du.Images.ReclaimableBytes != 0 || du.Snapshots.Count != 3 || du.Sandboxes.Count != 0 {
		t.Fatalf("after prune: %+v", du)
	}
}
