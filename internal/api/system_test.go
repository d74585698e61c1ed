package api

import (
	"context"
	"crypto/rand"
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
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/image"
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

// addCachedLayer puts a blob of random bytes into dataDir's OCI layer
// cache and returns its digest.
func addCachedLayer(t *testing.T, dataDir string) string {
	t.Helper()
	b := make([]byte, 16<<10)
	rand.Read(b)
	sum := sha256.Sum256(b)
	dir := filepath.Join(image.LayerCacheDir(dataDir), "sha256")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, hex.EncodeToString(sum[:])), b, 0o444); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(sum[:])
}

// setImageLayers records in the image in imgDir that it was built from an
// OCI image of layers.
func setImageLayers(t *testing.T, imgDir string, layers ...string) {
	t.Helper()
	p := filepath.Join(imgDir, "image.json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["from"] = map[string]any{"ref": "registry.test/app:v1", "digest": "sha256:" + strings.Repeat("1", 64), "layers": layers}
	data, _ = json.Marshal(m)
	os.Remove(p)
	if err := os.WriteFile(p, data, 0o444); err != nil {
		t.Fatal(err)
	}
}

// TestSystemDFAndPruneOCILayers: df counts the OCI layer cache (active:
// listed by an image; reclaimable: listed by no image a snapshot uses); a
// prune removes the layers no image lists, with images also those of the
// images it removes, never one a kept image lists; while a pull holds the
// cache the layers are left (skipped says so) and the rest is pruned.
func TestSystemDFAndPruneOCILayers(t *testing.T) {
	tk := newTenancy(t, nil)
	dataDir := tk.s.Engine.Config().DataDir
	used, spare, orphan := addCachedLayer(t, dataDir), addCachedLayer(t, dataDir), addCachedLayer(t, dataDir)
	setImageLayers(t, filepath.Join(dataDir, "images", digestOf("a-base")), used)
	_, spareDir := addImage(t, dataDir, "spare", "spare")
	setImageLayers(t, spareDir, spare, used)
	exists := func(d string) bool {
		_, err := os.Stat(filepath.Join(image.LayerCacheDir(dataDir), "sha256", strings.TrimPrefix(d, "sha256:")))
		return err == nil
	}

	var du apiv1.DiskUsage
	tk.getJSON("ops", "/v1/system/df", &du)
	l := du.OCILayers
	if l.Count != 3 || l.Active != 2 || l.SizeBytes <= 0 || l.ReclaimableBytes*3 != l.SizeBytes*2 {
		t.Fatalf("df oci_layers %+v, want 3 layers, 2 active, 2/3 reclaimable", l)
	}
	prune := func(body string) (int, apiv1.PruneResponse) {
		t.Helper()
		var res apiv1.PruneResponse
		a := tk.call("ops", http.MethodPost, "/v1/system/prune", body, nil)
		if a.status == http.StatusOK && json.Unmarshal(a.body, &res) != nil {
			t.Fatalf("prune %s: %s", body, a.body)
		}
		return a.status, res
	}
	if code, dry := prune(`{"dry_run":true}`); code != http.StatusOK || !slices.Equal(dry.OCILayers, []string{orphan}) {
		t.Fatalf("dry run without images: %d %+v", code, dry)
	}
	code, dry := prune(`{"images":true,"dry_run":true}`)
	slices.Sort(dry.OCILayers)
	want := []string{orphan, spare}
	slices.Sort(want)
	if code != http.StatusOK || !slices.Equal(dry.OCILayers, want) || !exists(orphan) || !exists(spare) {
		t.Fatalf("dry run with images: %d %+v", code, dry)
	}

	if code, res := prune(`{}`); code != http.StatusOK || !slices.Equal(res.OCILayers, []string{orphan}) || exists(orphan) || !exists(spare) {
		t.Fatalf("prune: %d %+v", code, res)
	}

	// A pull holds the cache: the layers are left, said so, and the rest
	// (the image) is pruned; the next prune takes the layer.
	unlock, err := fsutil.LockFileShared(context.Background(), filepath.Join(image.LayerCacheDir(dataDir), ".lock"), "the test")
	if err != nil {
		t.Fatal(err)
	}
	code, res := prune(`{"images":true}`)
	unlock()
	if _, err := os.Stat(spareDir); code != http.StatusOK || len(res.Images) != 1 || err == nil || !exists(spare) ||
		len(res.OCILayers) != 0 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "in use by an image build") {
		t.Fatalf("prune while a pull holds the cache: %d %+v (image dir: %v)", code, res, err)
	}

	code, res = prune(`{"images":true}`)
	if code != http.StatusOK || !slices.Equal(res.OCILayers, []string{spare}) || len(res.Images) != 0 || exists(spare) || !exists(used) {
		t.Fatalf("prune after the pull: %d %+v", code, res)
	}
	tk.getJSON("ops", "/v1/system/df", &du)
	if l := du.OCILayers; l.Count != 1 || l.Active != 1 || l.ReclaimableBytes != 0 {
		t.Fatalf("df after the prunes: %+v", l)
	}
}
