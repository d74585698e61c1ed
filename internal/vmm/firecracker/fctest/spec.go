package fctest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"gopkg.in/yaml.v3"
)

// draft07 is the JSON Schema dialect the Swagger 2.0 schema objects are
// checked under: for the keywords firecracker.yaml uses (type, required,
// enum, properties, additionalProperties, items, minimum, maximum, $ref
// into #/definitions) Swagger 2.0's subset of draft 4 means the same in
// draft-07.
const draft07 = "http://json-schema.org/draft-07/schema#"

// firecrackerYAML is Firecracker's own API description,
// src/firecracker/swagger/firecracker.yaml of firecracker-microvm/firecracker
// (Apache-2.0), version 1.17.0-dev, unchanged.
//
//go:embed firecracker.yaml
var firecrackerYAML []byte

// Firecracker parses the API description the driver is written against.
func Firecracker() (*Spec, error) { return ParseSpec(firecrackerYAML) }

// Spec is Firecracker's API description, ready to check requests and
// responses against.
type Spec struct {
	// Version is info.version of the description ("1.17.0-dev").
	Version string
	ops     map[string]*Operation // "PUT /drives/{drive_id}"
	paths   []string              // path templates, sorted
}

// Operation is one method on one path of the API.
type Operation struct {
	Method string
	Path   string // template, e.g. /drives/{drive_id}
	ID     string // operationId
	// Body validates the request body; nil when the operation takes none.
	Body *jsonschema.Resolved
	// BodyRequired: the body parameter is required.
	BodyRequired bool
	// Responses maps a status ("204", "400", "default") to its body
	// schema (nil: no body).
	Responses map[string]*jsonschema.Resolved
}

type swaggerDoc struct {
	Swagger string `yaml:"swagger"`
	Info    struct {
		Version string `yaml:"version"`
	} `yaml:"info"`
	Paths       map[string]map[string]swaggerOp `yaml:"paths"`
	Definitions map[string]any                  `yaml:"definitions"`
}

type swaggerOp struct {
	OperationID string `yaml:"operationId"`
	Parameters  []struct {
		Name     string         `yaml:"name"`
		In       string         `yaml:"in"`
		Required bool           `yaml:"required"`
		Schema   map[string]any `yaml:"schema"`
	} `yaml:"parameters"`
	Responses map[string]struct {
		Schema map[string]any `yaml:"schema"`
	} `yaml:"responses"`
}

// ParseSpec parses a Swagger 2.0 description. Every object schema that
// lists properties and says nothing of additionalProperties is closed
// (additionalProperties false): Firecracker's request types reject
// unknown fields (serde's deny_unknown_fields), so a field the
// description does not name would fail on a real Firecracker too.
func ParseSpec(data []byte) (*Spec, error) {
	var doc swaggerDoc
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("fctest: parse the API description: %w", err)
	}
	if doc.Swagger != "2.0" {
		return nil, fmt.Errorf("fctest: swagger %q, want 2.0", doc.Swagger)
	}
	defs := map[string]any{}
	for name, d := range doc.Definitions {
		defs[name] = closeObjects(d)
	}
	s := &Spec{Version: doc.Info.Version, ops: map[string]*Operation{}}
	// Most schemas are a $ref to one of a few definitions (Error above
	// all): resolve each distinct schema once.
	cache := map[string]*jsonschema.Resolved{}
	resolve := func(schema map[string]any) (*jsonschema.Resolved, error) {
		key, _ := json.Marshal(schema)
		if r, ok := cache[string(key)]; ok {
			return r, nil
		}
		r, err := resolveSchema(schema, defs)
		if err == nil {
			cache[string(key)] = r
		}
		return r, err
	}
	for path, methods := range doc.Paths {
		s.paths = append(s.paths, path)
		for method, op := range methods {
			o := &Operation{Method: strings.ToUpper(method), Path: path, ID: op.OperationID, Responses: map[string]*jsonschema.Resolved{}}
			for _, p := range op.Parameters {
				if p.In != "body" {
					continue
				}
				r, err := resolve(p.Schema)
				if err != nil {
					return nil, fmt.Errorf("fctest: %s %s body: %w", o.Method, path, err)
				}
				o.Body, o.BodyRequired = r, p.Required
			}
			for code, resp := range op.Responses {
				if resp.Schema == nil {
					o.Responses[code] = nil
					continue
				}
				r, err := resolve(resp.Schema)
				if err != nil {
					return nil, fmt.Errorf("fctest: %s %s response %s: %w", o.Method, path, code, err)
				}
				o.Responses[code] = r
			}
			s.ops[o.Method+" "+path] = o
		}
	}
	sort.Strings(s.paths)
	return s, nil
}

// closeObjects returns a copy of a schema in which object schemas with
// properties and no additionalProperties get additionalProperties false.
func closeObjects(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v)+1)
		for k, e := range v {
			if k == "properties" {
				props := map[string]any{}
				for name, p := range e.(map[string]any) {
					props[name] = closeObjects(p)
				}
				out[k] = props
				continue
			}
			out[k] = closeObjects(e)
		}
		if _, ok := v["properties"]; ok {
			if _, set := v["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = closeObjects(e)
		}
		return out
	}
	return v
}

// resolveSchema turns one schema of the description into a validator: the
// schema itself at the root, with every definition beside it for $ref.
func resolveSchema(schema map[string]any, defs map[string]any) (*jsonschema.Resolved, error) {
	root := map[string]any{}
	for k, v := range closeObjects(schema).(map[string]any) {
		root[k] = v
	}
	root["$schema"] = draft07
	root["definitions"] = defs
	b, err := json.Marshal(root)
	if err != nil {
		return nil, err
	}
	var js jsonschema.Schema
	if err := json.Unmarshal(b, &js); err != nil {
		return nil, err
	}
	return js.Resolve(nil)
}

// Lookup finds the operation for a request, and the path's parameters
// by name. It fails for a path the description does not have, and for a
// method the path does not take.
func (s *Spec) Lookup(method, path string) (*Operation, map[string]string, error) {
	for _, tmpl := range s.paths {
		params, ok := matchPath(tmpl, path)
		if !ok {
			continue
		}
		if op := s.ops[method+" "+tmpl]; op != nil {
			return op, params, nil
		}
		return nil, nil, fmt.Errorf("%s %s: the path takes no %s", method, path, method)
	}
	return nil, nil, fmt.Errorf("%s %s: no such path in the API description", method, path)
}

func matchPath(tmpl, path string) (map[string]string, bool) {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return nil, false
	}
	params := map[string]string{}
	for i, t := range ts {
		if strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			if ps[i] == "" {
				return nil, false
			}
			params[t[1:len(t)-1]] = ps[i]
			continue
		}
		if t != ps[i] {
			return nil, false
		}
	}
	return params, true
}

// CheckRequest validates a request body against its operation: present
// when required, JSON, and valid for the body schema.
func (o *Operation) CheckRequest(body []byte) (any, error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		if o.Body != nil && o.BodyRequired {
			return nil, fmt.Errorf("%s %s: the body is required", o.Method, o.Path)
		}
		return nil, nil
	}
	if o.Body == nil {
		return nil, fmt.Errorf("%s %s: takes no body", o.Method, o.Path)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%s %s: the body is not JSON: %v", o.Method, o.Path, err)
	}
	if err := o.Body.Validate(v); err != nil {
		return nil, fmt.Errorf("%s %s: %v", o.Method, o.Path, err)
	}
	return v, nil
}

// CheckResponse validates a response the fake sends: a status the
// operation documents (or its default) and a body of that status's
// schema.
func (o *Operation) CheckResponse(status int, body []byte) error {
	schema, ok := o.Responses[strconv.Itoa(status)]
	if !ok {
		if schema, ok = o.Responses["default"]; !ok {
			return fmt.Errorf("%s %s: status %d is not documented", o.Method, o.Path, status)
		}
	}
	if schema == nil {
		if len(body) != 0 {
			return fmt.Errorf("%s %s: status %d has no body", o.Method, o.Path, status)
		}
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s %s: response body: %v", o.Method, o.Path, err)
	}
	return schema.Validate(v)
}
