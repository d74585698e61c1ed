package api

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"

	"gopkg.in/yaml.v3"
)

// openAPIYAML is the API's OpenAPI 3.1 description, kept by hand next to
// the routes; openapi_test.go checks that it lists exactly the routes the
// Handler registers.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPIJSON returns the OpenAPI document as JSON, keys in the order the
// YAML file gives them. It is converted once; the result must not be
// modified.
func OpenAPIJSON() []byte { return openAPIJSON() }

var openAPIJSON = sync.OnceValue(func() []byte {
	b, err := yamlToJSON(openAPIYAML)
	if err != nil {
		// The document is embedded at build time and parsed by the tests.
		panic(fmt.Sprintf("api: embedded openapi.yaml: %v", err))
	}
	return b
})

// OpenAPIHandler serves OpenAPIJSON (GET /v1/openapi.json).
func OpenAPIHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc := OpenAPIJSON()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(doc)))
		w.Write(doc)
	})
}

// yamlToJSON converts one YAML document to compact JSON, keeping mapping
// order. Only what JSON can say is accepted: string keys, finite numbers.
func yamlToJSON(src []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeJSONNode(&buf, &doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeJSONNode(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return fmt.Errorf("line %d: want one document", n.Line)
		}
		return writeJSONNode(buf, n.Content[0])
	case yaml.AliasNode:
		return writeJSONNode(buf, n.Alias)
	case yaml.MappingNode:
		buf.WriteByte('{')
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return fmt.Errorf("line %d: mapping keys must be plain scalars", k.Line)
			}
			if seen[k.Value] {
				return fmt.Errorf("line %d: duplicate key %q", k.Line, k.Value)
			}
			seen[k.Value] = true
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSONValue(buf, k.Value); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := writeJSONNode(buf, v); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
		return nil
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSONNode(buf, c); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
		return nil
	case yaml.ScalarNode:
		var v any
		switch n.ShortTag() {
		case "!!str", "!!binary", "!!timestamp":
			v = n.Value
		case "!!null":
			v = nil
		case "!!bool", "!!int", "!!float":
			if err := n.Decode(&v); err != nil {
				return fmt.Errorf("line %d: %v", n.Line, err)
			}
			if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
				return fmt.Errorf("line %d: %s has no JSON form", n.Line, n.Value)
			}
		default:
			return fmt.Errorf("line %d: unsupported tag %s", n.Line, n.ShortTag())
		}
		if err := writeJSONValue(buf, v); err != nil {
			return fmt.Errorf("line %d: %v", n.Line, err)
		}
		return nil
	}
	return fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

// writeJSONValue writes v as JSON without escaping <, > and & (the
// document is served as application/json, never embedded in HTML).
func writeJSONValue(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
	return nil
}
