package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// awaitingWiring lists documented routes that server.go does not register
// yet. The test tolerates them only while they are unregistered; once one
// is wired, delete it here.
var awaitingWiring = map[string]bool{}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

type openAPIDoc map[string]any

func loadDoc(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(OpenAPIJSON(), &doc); err != nil {
		t.Fatalf("OpenAPIJSON is not JSON: %v", err)
	}
	return doc
}

func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }

// resolve follows a local $ref ("#/components/...") once, or returns v.
func (d openAPIDoc) resolve(t *testing.T, v any) map[string]any {
	t.Helper()
	m := obj(v)
	ref, ok := m["$ref"].(string)
	if !ok {
		return m
	}
	cur := any(map[string]any(d))
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		cur = obj(cur)[part]
	}
	if cur == nil {
		t.Fatalf("$ref %s does not resolve", ref)
	}
	return obj(cur)
}

type operation struct {
	key  string // "GET /v1/sandboxes/{id}"
	path string
	op   map[string]any
}

func (d openAPIDoc) operations() []operation {
	var ops []operation
	for path, item := range obj(d["paths"]) {
		for _, m := range httpMethods {
			if op := obj(obj(item)[m]); op != nil {
				ops = append(ops, operation{key: strings.ToUpper(m) + " " + path, path: path, op: op})
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].key < ops[j].key })
	return ops
}

// registeredPatterns reads the patterns passed to mux.Handle/HandleFunc in
// the package's non-test sources (ServeMux cannot list its routes).
func registeredPatterns(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: route pattern is not a string literal; the OpenAPI test cannot read it", fset.Position(call.Pos()))
				return true
			}
			p, _ := strconv.Unquote(lit.Value)
			out[p] = fset.Position(call.Pos()).String()
			return true
		})
	}
	if len(out) == 0 {
		t.Fatal("found no mux.HandleFunc calls")
	}
	return out
}

// routeKey turns a ServeMux pattern into "METHOD /path" (OpenAPI syntax).
func routeKey(pattern string) string {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "ANY", pattern
	}
	return method + " " + strings.ReplaceAll(path, "...}", "}")
}

// servedByRoute sends a request for a documented operation through the
// real handler of a Server without an engine and reports whether a route
// took it (not the "no route" fallback). Handlers that reach the missing
// engine panic; that, too, proves a route matched.
func servedByRoute(h http.Handler, method, path string) (served bool, detail string) {
	path = strings.NewReplacer("{id}", "sb-probe", "{tag}", "probe", "{pid}", "1").Replace(path)
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil {
				served, detail = true, fmt.Sprint("handler panicked without an engine: ", p)
			}
		}()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	}()
	if served {
		return served, detail
	}
	var p apiv1.Problem
	json.Unmarshal(rec.Body.Bytes(), &p)
	if rec.Code == http.StatusNotFound && strings.HasPrefix(p.Detail, "no route") {
		return false, p.Detail
	}
	return true, fmt.Sprintf("status %d", rec.Code)
}

func TestOpenAPICoversEveryRoute(t *testing.T) {
	doc := loadDoc(t)
	documented := map[string]bool{}
	for _, op := range doc.operations() {
		documented[op.key] = true
	}
	registered := map[string]bool{}
	patterns := registeredPatterns(t)
	withMethod := map[string]bool{}
	for pattern := range patterns {
		if _, path, ok := strings.Cut(pattern, " "); ok {
			withMethod[path] = true
		}
	}
	for pattern, pos := range patterns {
		if pattern == "/" {
			continue // the problem+json fallback for unknown routes
		}
		if !strings.Contains(pattern, " ") && withMethod[pattern] {
			continue // answers 405 for the methods the document does not list
		}
		key := routeKey(pattern)
		registered[key] = true
		if !documented[key] {
			t.Errorf("route %q (%s) is not in openapi.yaml", pattern, pos)
		}
	}

	s := &Server{}
	// Streams closed: GET /v1/events answers 503 at once instead of
	// streaming until its client leaves.
	s.CloseStreams()
	h := s.Handler()
	for key := range documented {
		method, path, _ := strings.Cut(key, " ")
		served, detail := servedByRoute(h, method, path)
		switch {
		case awaitingWiring[key] && !registered[key] && !served:
			t.Logf("%s is documented but not registered yet (awaiting wiring)", key)
		case awaitingWiring[key]:
			t.Errorf("%s is registered now: delete it from awaitingWiring", key)
		case !registered[key]:
			t.Errorf("openapi.yaml documents %s, which no mux.HandleFunc registers", key)
		case !served:
			t.Errorf("openapi.yaml documents %s, but the handler answers %s", key, detail)
		}
	}
}

func TestOpenAPIDocument(t *testing.T) {
	doc := loadDoc(t)
	if doc["openapi"] != "3.1.0" {
		t.Errorf("openapi %v, want 3.1.0", doc["openapi"])
	}
	// Key order survives the YAML to JSON conversion.
	if !bytes.HasPrefix(OpenAPIJSON(), []byte(`{"openapi":"3.1.0","info":`)) {
		t.Errorf("document starts %.40s", OpenAPIJSON())
	}

	// Every local reference resolves.
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				if !strings.HasPrefix(ref, "#/components/") {
					t.Errorf("%s: non-local $ref %s", at, ref)
				} else {
					doc.resolve(t, v)
				}
			}
			for k, c := range v {
				walk(c, at+"/"+k)
			}
		case []any:
			for i, c := range v {
				walk(c, at+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(map[string]any(doc), "#")

	// Bearer auth everywhere but healthz.
	bearer := obj(obj(obj(doc["components"])["securitySchemes"])["bearer"])
	if bearer["type"] != "http" || bearer["scheme"] != "bearer" {
		t.Errorf("bearer scheme %v", bearer)
	}
	if global, _ := doc["security"].([]any); len(global) != 1 || obj(global[0])["bearer"] == nil {
		t.Errorf("global security %v, want bearer", doc["security"])
	}

	ids := map[string]bool{}
	for _, op := range doc.operations() {
		id, _ := op.op["operationId"].(string)
		if id == "" || ids[id] {
			t.Errorf("%s: operationId %q missing or duplicate", op.key, id)
		}
		ids[id] = true

		sec, hasSec := op.op["security"]
		if op.key == "GET /v1/healthz" {
			if s, _ := sec.([]any); !hasSec || len(s) != 0 {
				t.Errorf("%s must be documented as unauthenticated (security: [])", op.key)
			}
		} else if hasSec {
			t.Errorf("%s overrides security; only healthz is unauthenticated", op.key)
		}

		responses := obj(op.op["responses"])
		problem := false
		for code, r := range responses {
			resp := doc.resolve(t, r)
			if obj(resp["headers"])["X-Request-Id"] == nil {
				t.Errorf("%s %s: response lacks the X-Request-Id header", op.key, code)
			}
			if code == "default" || code[0] == '4' || code[0] == '5' {
				ct := obj(resp["content"])
				if len(ct) != 1 || ct["application/problem+json"] == nil {
					t.Errorf("%s %s: error response is not application/problem+json only", op.key, code)
					continue
				}
				if ref := obj(obj(ct["application/problem+json"])["schema"])["$ref"]; ref != "#/components/schemas/Problem" {
					t.Errorf("%s %s: error schema %v, want Problem", op.key, code, ref)
				}
				problem = true
			}
		}
		if !problem {
			t.Errorf("%s documents no problem+json error response", op.key)
		}
		if op.key != "GET /v1/healthz" && responses["401"] == nil {
			t.Errorf("%s does not document 401", op.key)
		}
		if obj(doc.resolve(t, responses["401"])["headers"])["WWW-Authenticate"] == nil && responses["401"] != nil {
			t.Errorf("%s: 401 lacks WWW-Authenticate", op.key)
		}
		// Path parameters are declared.
		for _, name := range []string{"id", "tag", "pid"} {
			if strings.Contains(op.path, "{"+name+"}") && !declaresParam(t, doc, op, name, "path") {
				t.Errorf("%s: path parameter %s not declared", op.key, name)
			}
		}
	}

	// Problem codes are exactly errdefs' classes.
	codes := obj(obj(obj(obj(doc["components"])["schemas"])["Problem"])["properties"])["code"]
	var want []any
	for _, c := range errdefs.Classes {
		want = append(want, c.Code)
	}
	if got, _ := obj(codes)["enum"].([]any); !sameSet(got, want) {
		t.Errorf("Problem code enum %v, want errdefs classes %v", got, want)
	}
}

func declaresParam(t *testing.T, doc openAPIDoc, op operation, name, in string) bool {
	item := obj(obj(doc["paths"])[op.path])
	params, _ := item["parameters"].([]any)
	more, _ := op.op["parameters"].([]any)
	for _, p := range append(params, more...) {
		p := doc.resolve(t, p)
		if p["name"] == name && p["in"] == in {
			return p["required"] == true || in != "path"
		}
	}
	return false
}

// sameSet reports whether a and b hold the same values, in any order.
func sameSet(a, b []any) bool {
	strs := func(v []any) []string {
		out := make([]string, len(v))
		for i, x := range v {
			out[i] = fmt.Sprint(x)
		}
		sort.Strings(out)
		return out
	}
	return slices.Equal(strs(a), strs(b))
}

func TestOpenAPIStreamsAndRawBodies(t *testing.T) {
	doc := loadDoc(t)
	op := func(key string) map[string]any {
		for _, o := range doc.operations() {
			if o.key == key {
				return o.op
			}
		}
		t.Fatalf("%s not documented", key)
		return nil
	}
	content := func(v any) map[string]any { return obj(doc.resolve(t, v)["content"]) }
	ok200 := func(key string) map[string]any {
		r := obj(op(key)["responses"])
		if r["200"] != nil {
			return content(r["200"])
		}
		return content(r["201"])
	}
	for key, schema := range map[string]string{
		"POST /v1/snapshots":           "Progress",
		"POST /v1/sandboxes/{id}/exec": "ExecEvent",
	} {
		c := ok200(key)
		nd := obj(c["application/x-ndjson"])
		if nd == nil {
			t.Errorf("%s: success content %v lacks application/x-ndjson", key, c)
			continue
		}
		if ref := obj(nd["schema"])["$ref"]; ref != "#/components/schemas/"+schema {
			t.Errorf("%s: stream items are %v, want %s", key, ref, schema)
		}
	}

	// Exec: the request travels in X-Forkd-Exec; stdin is the raw body.
	exec := op("POST /v1/sandboxes/{id}/exec")
	var hdr map[string]any
	params, _ := exec["parameters"].([]any)
	for _, p := range params {
		if p := doc.resolve(t, p); p["name"] == apiv1.ExecHeader && p["in"] == "header" {
			hdr = p
		}
	}
	if hdr == nil || hdr["required"] != true ||
		obj(obj(obj(hdr["content"])["application/json"])["schema"])["$ref"] != "#/components/schemas/ExecRequest" {
		t.Errorf("exec: header %s not documented as required JSON ExecRequest: %v", apiv1.ExecHeader, hdr)
	}
	if content(exec["requestBody"])["application/octet-stream"] == nil {
		t.Error("exec: stdin body is not application/octet-stream")
	}
	if c := content(op("POST /v1/sandboxes/{id}/processes/{pid}/stdin")["requestBody"]); len(c) != 1 || c["application/octet-stream"] == nil {
		t.Errorf("process stdin body %v, want application/octet-stream", c)
	}

	// Files: raw bytes both ways.
	if c := ok200("GET /v1/sandboxes/{id}/files"); len(c) != 1 || c["application/octet-stream"] == nil {
		t.Errorf("file read content %v, want application/octet-stream", c)
	}
	if c := content(op("PUT /v1/sandboxes/{id}/files")["requestBody"]); len(c) != 1 || c["application/octet-stream"] == nil {
		t.Errorf("file write body %v, want application/octet-stream", c)
	}
	// JSON request bodies are strict, as decode is.
	for _, key := range []string{"POST /v1/images", "POST /v1/snapshots", "POST /v1/sandboxes", "POST /v1/sandboxes/kill",
		"POST /v1/sandboxes/{id}/run_code", "POST /v1/sandboxes/{id}/files/mkdir", "POST /v1/sandboxes/{id}/processes/{pid}/signal",
		"POST /v1/sandboxes/{id}/processes/{pid}/resize"} {
		s := doc.resolve(t, obj(content(op(key)["requestBody"])["application/json"])["schema"])
		if s["additionalProperties"] != false {
			t.Errorf("%s: request schema allows unknown fields; the server rejects them", key)
		}
	}
}

// wireTypes maps component schemas to the Go types they describe. response
// marks types the server sends: their non-omitempty fields are always
// present and must be required.
var wireTypes = map[string]struct {
	typ      reflect.Type
	response bool
}{
	"Problem":               {reflect.TypeFor[apiv1.Problem](), true},
	"RunCodeEvent":          {reflect.TypeFor[apiv1.RunCodeEvent](), true},
	"BranchRequest":         {reflect.TypeFor[apiv1.BranchRequest](), false},
	"BranchResponse":        {reflect.TypeFor[apiv1.BranchResponse](), true},
	"Version":               {reflect.TypeFor[apiv1.Version](), true},
	"Check":                 {reflect.TypeFor[apiv1.Check](), true},
	"Image":                 {reflect.TypeFor[apiv1.Image](), true},
	"BuildImageRequest":     {reflect.TypeFor[apiv1.BuildImageRequest](), false},
	"CreateSnapshotRequest": {reflect.TypeFor[apiv1.CreateSnapshotRequest](), false},
	"FileEntry":             {reflect.TypeFor[apiv1.FileEntry](), true},
	"Snapshot":              {reflect.TypeFor[apiv1.Snapshot](), true},
	"Progress":              {reflect.TypeFor[apiv1.Progress](), true},
	"ForkRequest":           {reflect.TypeFor[apiv1.ForkRequest](), false},
	"Operation":             {reflect.TypeFor[apiv1.Operation](), true},
	"ExecResult":            {reflect.TypeFor[apiv1.ExecResult](), true},
	"ForkResponse":          {reflect.TypeFor[apiv1.ForkResponse](), true},
	"Sandbox":               {reflect.TypeFor[apiv1.Sandbox](), true},
	"KillRequest":           {reflect.TypeFor[apiv1.KillRequest](), false},
	"KillResponse":          {reflect.TypeFor[apiv1.KillResponse](), true},
	"RemovedSnapshots":      {reflect.TypeFor[apiv1.RemovedSnapshots](), true},
	"RunCodeRequest":        {reflect.TypeFor[apiv1.RunCodeRequest](), false},
	"RunCodeResult":         {reflect.TypeFor[apiv1.RunCodeResult](), true},
	"CodeError":             {reflect.TypeFor[apiv1.CodeError](), true},
	"ExecRequest":           {reflect.TypeFor[apiv1.ExecRequest](), false},
	"ExecEvent":             {reflect.TypeFor[apiv1.ExecEvent](), true},
	"FileInfo":              {reflect.TypeFor[apiv1.FileInfo](), true},
	"MkdirRequest":          {reflect.TypeFor[apiv1.MkdirRequest](), false},
	"ProcessInfo":           {reflect.TypeFor[apiv1.ProcessInfo](), true},
	"SignalRequest":         {reflect.TypeFor[apiv1.SignalRequest](), false},
	"PTY":                   {reflect.TypeFor[apiv1.PTY](), false},
	"Tenant":                {reflect.TypeFor[apiv1.Tenant](), true},
	"SandboxList":           {reflect.TypeFor[apiv1.List[apiv1.Sandbox]](), true},
	"SnapshotList":          {reflect.TypeFor[apiv1.List[apiv1.Snapshot]](), true},
	"ImageList":             {reflect.TypeFor[apiv1.List[apiv1.Image]](), true},
	"OperationList":         {reflect.TypeFor[apiv1.List[apiv1.Operation]](), true},
	"TenantList":            {reflect.TypeFor[apiv1.List[apiv1.Tenant]](), true},
	"Quota":                 {reflect.TypeFor[apiv1.Quota](), true},
	"TenantUsage":           {reflect.TypeFor[apiv1.TenantUsage](), true},
	"Usage":                 {reflect.TypeFor[apiv1.Usage](), true},
	"DiskUsage":             {reflect.TypeFor[apiv1.DiskUsage](), true},
	"PruneRequest":          {reflect.TypeFor[apiv1.PruneRequest](), false},
	"PruneResponse":         {reflect.TypeFor[apiv1.PruneResponse](), true},
}

// jsonType is the JSON Schema type encoding/json gives a Go type.
func jsonType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[time.Time]():
		return "string"
	case reflect.TypeFor[json.RawMessage]():
		return "any"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonType(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "string"
		}
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return "?"
}

// wireFields are t's fields as encoding/json sees them: an embedded
// struct's fields in its place.
func wireFields(t reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			out = append(out, wireFields(f.Type)...)
			continue
		}
		out = append(out, f)
	}
	return out
}

func TestOpenAPISchemasMatchWireTypes(t *testing.T) {
	doc := loadDoc(t)
	schemas := obj(obj(doc["components"])["schemas"])
	for name, wt := range wireTypes {
		s := obj(schemas[name])
		if s == nil {
			t.Errorf("schema %s missing", name)
			continue
		}
		props := obj(s["properties"])
		required := map[string]bool{}
		if r, ok := s["required"].([]any); ok {
			for _, n := range r {
				required[n.(string)] = true
				if props[n.(string)] == nil {
					t.Errorf("%s: required %q is not a property", name, n)
				}
			}
		}
		fields := map[string]bool{}
		for _, f := range wireFields(wt.typ) {
			tag := f.Tag.Get("json")
			jname, opts, _ := strings.Cut(tag, ",")
			if !f.IsExported() || jname == "-" {
				continue
			}
			if jname == "" {
				jname = f.Name
			}
			fields[jname] = true
			p := props[jname]
			if p == nil {
				t.Errorf("%s: field %s (%q) is not documented", name, f.Name, jname)
				continue
			}
			ps := doc.resolve(t, p)
			want := jsonType(f.Type)
			switch typ := ps["type"].(type) {
			case nil:
				if want != "any" {
					t.Errorf("%s.%s: no type documented", name, jname)
				}
			case string:
				if want != "any" && typ != want {
					t.Errorf("%s.%s: documented %s, Go type %s encodes as %s", name, jname, typ, f.Type, want)
				}
			case []any:
				if !slices.Contains(typ, any(want)) {
					t.Errorf("%s.%s: documented %v, Go type %s encodes as %s", name, jname, typ, f.Type, want)
				}
			}
			omitempty := strings.Contains(","+opts+",", ",omitempty,")
			if omitempty && required[jname] {
				t.Errorf("%s.%s is omitempty but documented as required", name, jname)
			}
			if wt.response && !omitempty && !required[jname] {
				t.Errorf("%s.%s is always sent but not documented as required", name, jname)
			}
		}
		for p := range props {
			if !fields[p] {
				t.Errorf("%s: documented property %q is not a field of %s", name, p, wt.typ)
			}
		}
	}
	states, _ := obj(schemas["SandboxState"])["enum"].([]any)
	var want []any
	for _, st := range apiv1.SandboxStates {
		want = append(want, st)
	}
	if !sameSet(states, want) {
		t.Errorf("SandboxState enum %v", states)
	}
}

func TestOpenAPIHandler(t *testing.T) {
	srv := httptest.NewServer(OpenAPIHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !bytes.Equal(body, OpenAPIJSON()) {
		t.Fatalf("status %d type %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
	}
	if !json.Valid(body) {
		t.Fatal("served document is not JSON")
	}
}

func TestYAMLToJSON(t *testing.T) {
	for in, want := range map[string]string{
		"b: 1\na: [x, 'y', \"2\"]\n":                  `{"b":1,"a":["x","y","2"]}`,
		"'200': {t: true, n: null, f: 1.5, s: '<&>'}": `{"200":{"t":true,"n":null,"f":1.5,"s":"<&>"}}`,
		"x: &a {k: v}\ny: *a\n":                       `{"x":{"k":"v"},"y":{"k":"v"}}`,
		"d: 2024-01-02\n":                             `{"d":"2024-01-02"}`,
		"m: |\n  two\n  lines\n":                      `{"m":"two\nlines\n"}`,
	} {
		got, err := yamlToJSON([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("yamlToJSON(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"a: 1\na: 2\n", "? [k]\n: v\n", "a: .inf\n", "a: [\n"} {
		if got, err := yamlToJSON([]byte(bad)); err == nil {
			t.Errorf("yamlToJSON(%q) = %s, want an error", bad, got)
		}
	}
}

// The tests of Instrument (middleware.go) live here too.

// scrapeMetrics returns the text exposition of m.
func scrapeMetrics(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// cloning derives a new request, as auth.Middleware does, so r.Pattern set
// by the mux is not visible to the caller.
func cloning(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, "x")))
	})
}

func TestInstrumentLabelsByPattern(t *testing.T) {
	m := metrics.New("test")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, fmt.Errorf("x: %w", errdefs.ErrResourceExhausted))
	})
	mux.HandleFunc("GET /v1/quiet", func(w http.ResponseWriter, r *http.Request) {})
	h := Instrument(m, mux, cloning(mux))
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/sb-1"}, {"GET", "/v1/sandboxes/sb-2"}, {"DELETE", "/v1/sandboxes/sb-3"},
		{"POST", "/v1/sandboxes"}, {"GET", "/v1/quiet"}, {"GET", "/v1/nothing/here"}, {"GET", "/v1//sandboxes/x"},
		{"HEAD", "/v1/sandboxes/sb-4"}, {"CONNECT", "/v1/raw/path"},
	} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(req.method, req.path, nil))
	}
	body := scrapeMetrics(t, m)
	for _, l := range []string{
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/sandboxes/{id}"} 2`,
		`forkd_http_request_duration_seconds_count{code="200",method="HEAD",route="/v1/sandboxes/{id}"} 1`,
		`forkd_http_request_duration_seconds_count{code="204",method="DELETE",route="/v1/sandboxes/{id}"} 1`,
		`forkd_http_request_duration_seconds_count{code="429",method="POST",route="/v1/sandboxes"} 1`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/quiet"} 1`,
		`forkd_http_request_duration_seconds_count{code="404",method="GET",route="unmatched"} 1`,
		`forkd_http_request_duration_seconds_count{code="307",method="GET",route="/v1/sandboxes/{id}"} 1`,
		`forkd_http_request_duration_seconds_count{code="404",method="CONNECT",route="unmatched"} 1`,
	} {
		if !strings.Contains(body, l+"\n") {
			t.Errorf("scrape lacks %s", l)
		}
	}
	if strings.Contains(body, "sb-1") || strings.Contains(body, "/v1/nothing") || strings.Contains(body, "/v1/raw") {
		t.Error("a raw path leaked into a label")
	}

	// Without a mux, r.Pattern is read back when next is the mux itself.
	m2 := metrics.New("test")
	Instrument(m2, nil, mux).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/sandboxes/sb-9", nil))
	if !strings.Contains(scrapeMetrics(t, m2), `forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/sandboxes/{id}"} 1`) {
		t.Error("nil mux: route not taken from r.Pattern")
	}

	if Instrument(nil, mux, mux) == nil {
		t.Error("nil metrics must return next")
	}
}

func grep(s, sub string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}

func TestInstrumentKeepsStreamingAndDuplex(t *testing.T) {
	m := metrics.New("test")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			t.Error("wrapped writer is not an http.Flusher")
		}
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Errorf("EnableFullDuplex through the wrapper: %v", err)
		}
		if err := rc.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Errorf("SetWriteDeadline through the wrapper: %v", err)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("{\"type\":\"stdout\"}\n"))
		if err := rc.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		// Read stdin after the first event went out: full duplex.
		line, _ := bufio.NewReader(r.Body).ReadString('\n')
		w.Write([]byte("{\"type\":\"exit\",\"echo\":" + strconv.Quote(strings.TrimSpace(line)) + "}\n"))
		w.(http.Flusher).Flush()
	})
	srv := httptest.NewServer(Instrument(m, mux, cloning(mux)))
	defer srv.Close()

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes/sb-1/exec", pr)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, "stdout") {
		t.Fatalf("first event %q %v: not flushed before stdin was sent", first, err)
	}
	pw.Write([]byte("hello\n"))
	pw.Close()
	last, _ := br.ReadString('\n')
	if !strings.Contains(last, `"echo":"hello"`) {
		t.Errorf("exit event %q", last)
	}
	resp.Body.Close()
	srv.Close() // waits for the handler and its deferred observation
	if body := scrapeMetrics(t, m); !strings.Contains(body,
		`forkd_http_request_duration_seconds_count{code="200",method="POST",route="/v1/sandboxes/{id}/exec"} 1`) {
		t.Errorf("streamed request not recorded:\n%s", grep(body, "forkd_http"))
	}
}

func TestInstrumentRecordsPanics(t *testing.T) {
	m := metrics.New("test")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	mux.HandleFunc("GET /v1/abort", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("partial"))
		panic(http.ErrAbortHandler)
	})
	h := Instrument(m, mux, mux)
	for _, path := range []string{"/v1/boom", "/v1/abort"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: panic swallowed", path)
				}
			}()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
		}()
	}
	body := scrapeMetrics(t, m)
	for _, l := range []string{
		`forkd_http_request_duration_seconds_count{code="500",method="GET",route="/v1/boom"} 1`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/abort"} 1`,
	} {
		if !strings.Contains(body, l+"\n") {
			t.Errorf("scrape lacks %s", l)
		}
	}
}

func TestStatusWriterIgnoresInformational(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := &statusWriter{ResponseWriter: rec}
	sw.WriteHeader(http.StatusEarlyHints)
	if sw.status != 0 {
		t.Errorf("1xx recorded as the status: %d", sw.status)
	}
	sw.WriteHeader(http.StatusAccepted)
	sw.WriteHeader(http.StatusTeapot) // superfluous; net/http ignores it too
	if sw.status != http.StatusAccepted {
		t.Errorf("status %d, want 202", sw.status)
	}
	if sw.Unwrap() != rec {
		t.Error("Unwrap does not return the underlying writer")
	}
}

// TestOpenAPIRequestIDMatchesServer: the X-Request-Id schemas (the
// parameter and the response header) say what validRequestID keeps.
func TestOpenAPIRequestIDMatchesServer(t *testing.T) {
	doc := loadDoc(t)
	comps := obj(doc["components"])
	for _, at := range []struct {
		name   string
		schema map[string]any
	}{
		{"parameters/RequestId", obj(obj(obj(comps["parameters"])["RequestId"])["schema"])},
		{"headers/RequestId", obj(obj(obj(comps["headers"])["RequestId"])["schema"])},
	} {
		if ml, _ := at.schema["maxLength"].(float64); int(ml) != maxRequestIDLen {
			t.Errorf("%s: maxLength %v, the server keeps up to %d", at.name, at.schema["maxLength"], maxRequestIDLen)
		}
		pat, _ := at.schema["pattern"].(string)
		re, err := regexp.Compile(pat)
		if pat == "" || err != nil {
			t.Errorf("%s: pattern %q (%v)", at.name, pat, err)
			continue
		}
		for _, id := range []string{"req-1", "mcp:abc_DEF.42", strings.Repeat("a", maxRequestIDLen), strings.Repeat("a", maxRequestIDLen+1),
			"", "has space", `quo"te`, "new\nline", "ünï", "a/b", "a+b"} {
			if re.MatchString(id) != validRequestID(id) {
				t.Errorf("%s: pattern %q says %v for %q, the server %v", at.name, pat, re.MatchString(id), id, validRequestID(id))
			}
		}
	}
}
