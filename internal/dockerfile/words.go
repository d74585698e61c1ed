package dockerfile

import (
	"fmt"
	"strings"
)

// words splits an instruction's arguments as Docker does for COPY, ENV,
// WORKDIR and USER: a JSON array of strings as is; otherwise on unquoted
// spaces, with quotes removed, backslash escapes applied and variables
// ($VAR, ${VAR}, ${VAR:-default}, ${VAR:+alternative}) substituted
// outside single quotes.
func (p *parser) words(s string) ([]string, error) {
	if argv, ok, _ := execForm(s); ok {
		for i, a := range argv {
			v, err := p.expand(a)
			if err != nil {
				return nil, err
			}
			argv[i] = v
		}
		return argv, nil
	}
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, unsupported(fmt.Sprintf("unterminated ' in %q", s))
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := i + 1
			var q strings.Builder
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) && (s[j+1] == '"' || s[j+1] == '\\' || s[j+1] == '$') {
					j++
					if s[j] == '$' {
						q.WriteString(`\$`) // kept for expand to leave alone
						continue
					}
				}
				q.WriteByte(s[j])
			}
			if j == len(s) {
				return nil, unsupported(fmt.Sprintf("unterminated \" in %q", s))
			}
			v, err := p.expand(q.String())
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i = j
			inWord = true
		case c == '$':
			end := varEnd(s, i)
			v, err := p.expand(s[i:end])
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i = end - 1
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// varEnd is the index after the variable reference that starts at s[i]
// ('$').
func varEnd(s string, i int) int {
	if i+1 < len(s) && s[i+1] == '{' {
		depth := 0
		for j := i + 1; j < len(s); j++ {
			switch s[j] {
			case '{':
				depth++
			case '}':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	}
	j := i + 1
	for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
		j++
	}
	return j
}

// expand substitutes variables in s (no quote handling; `\$` is a
// literal '$').
func (p *parser) expand(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		end := varEnd(s, i)
		ref := s[i+1 : end]
		if ref == "" {
			b.WriteByte('$')
			continue
		}
		if strings.HasPrefix(ref, "{") {
			if !strings.HasSuffix(ref, "}") {
				return "", unsupported(fmt.Sprintf("unterminated ${ in %q", s))
			}
			ref = ref[1 : len(ref)-1]
		}
		v, err := p.lookup(ref)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
		i = end - 1
	}
	return b.String(), nil
}

// lookup resolves NAME, NAME:-DEFAULT or NAME:+ALTERNATIVE: ENV values
// first, then ARGs; an unset variable is empty, as in Docker.
func (p *parser) lookup(ref string) (string, error) {
	name, op, word := ref, "", ""
	if i := strings.Index(ref, ":"); i >= 0 {
		name, op, word = ref[:i], ref[i:min(i+2, len(ref))], ref[min(i+2, len(ref)):]
		if op != ":-" && op != ":+" {
			return "", unsupported(fmt.Sprintf("${%s}: only ${VAR}, ${VAR:-default} and ${VAR:+alternative} are supported", ref))
		}
	}
	if !validKey(name) {
		return "", unsupported(fmt.Sprintf("${%s}: %q is not a variable name", ref, name))
	}
	v, set := p.env[name]
	if !set {
		v, set = p.args[name]
	}
	switch op {
	case ":-":
		if v == "" {
			return p.expand(word)
		}
	case ":+":
		if v != "" {
			return p.expand(word)
		}
		return "", nil
	}
	return v, nil
}

// unquote removes one level of matching quotes around s.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' && s[len(s)-1] == '"' || s[0] == '\'' && s[len(s)-1] == '\'') {
		return s[1 : len(s)-1]
	}
	return s
}
