// Package dockerfile reads the subset of the Dockerfile format that forkd
// builds inside microVMs (internal/image): one FROM, then RUN, COPY and ADD
// of local files, ENV, WORKDIR, USER, ARG, CMD and ENTRYPOINT. Everything
// else (other
// instructions, heredocs, ADD of URLs or archives, multi-stage builds,
// flags such as --chown or --mount) is an error that names the line and the
// instruction, never silently ignored: an image that differs from what
// Docker would build is worse than a refusal.
package dockerfile

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// Bounds on what Parse reads.
const (
	MaxBytes        = 1 << 20
	MaxInstructions = 1000
)

// File is a parsed Dockerfile.
type File struct {
	// From is the base image reference, with ARGs substituted.
	From  string
	Steps []recipe.Step
}

// instruction is one logical line: continuations joined.
type instruction struct {
	line int    // first physical line, from 1
	cmd  string // upper case
	args string // the rest, leading space trimmed
}

// Parse reads a Dockerfile. name is used in messages ("Dockerfile");
// buildArgs override ARG defaults (--build-arg), and each must be
// declared by an ARG.
func Parse(name string, data []byte, buildArgs map[string]string) (*File, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the limit of %d: %w", name, len(data), MaxBytes, errdefs.ErrInvalidArgument)
	}
	ins, err := split(name, string(data))
	if err != nil {
		return nil, err
	}
	p := &parser{name: name, args: map[string]string{}, given: buildArgs, used: map[string]bool{}}
	for _, in := range ins {
		if err := p.instruction(in); err != nil {
			return nil, fmt.Errorf("%s:%d %s: %w", name, in.line, in.cmd, err)
		}
	}
	if p.out.From == "" {
		return nil, fmt.Errorf("%s has no FROM instruction: %w", name, errdefs.ErrInvalidArgument)
	}
	for k := range buildArgs {
		if !p.used[k] {
			return nil, fmt.Errorf("%s: build argument %q is not declared by an ARG instruction: %w", name, k, errdefs.ErrInvalidArgument)
		}
	}
	return &p.out, nil
}

// split joins continuation lines (a trailing backslash) and drops
// comments and blank lines. A comment line inside a continuation is
// dropped too, as Docker does.
func split(name, src string) ([]instruction, error) {
	var out []instruction
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			if err := checkDirective(name, i+1, l, len(out) == 0); err != nil {
				return nil, err
			}
			continue
		}
		start := i
		var b strings.Builder
		for {
			cont := strings.HasSuffix(l, `\`)
			b.WriteString(strings.TrimSuffix(l, `\`))
			if !cont {
				break
			}
			// The next line that is neither empty nor a comment continues.
			for i++; i < len(lines); i++ {
				l = strings.TrimSpace(lines[i])
				if l != "" && !strings.HasPrefix(l, "#") {
					break
				}
			}
			if i == len(lines) {
				break // a trailing backslash at the end of the file
			}
			b.WriteByte(' ')
		}
		cmd, args, _ := strings.Cut(strings.TrimSpace(b.String()), " ")
		out = append(out, instruction{line: start + 1, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		if len(out) > MaxInstructions {
			return nil, fmt.Errorf("%s has more than %d instructions: %w", name, MaxInstructions, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

// checkDirective refuses parser directives forkd does not follow: an
// escape character other than the backslash. syntax= is ignored (forkd
// is its own front end).
func checkDirective(name string, line int, l string, head bool) error {
	if !head {
		return nil
	}
	k, v, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(l, "#")), "=")
	if ok && strings.EqualFold(strings.TrimSpace(k), "escape") && strings.TrimSpace(v) != `\` {
		return fmt.Errorf("%s:%d: the escape directive %q is not supported (only the default backslash): %w", name, line, strings.TrimSpace(v), errdefs.ErrInvalidArgument)
	}
	return nil
}

type parser struct {
	name string
	out  File
	args map[string]string // ARGs in scope: their values
	// global holds the ARGs declared before FROM: in scope after it only
	// when declared again (Docker's rule).
	global map[string]string
	given  map[string]string // --build-arg
	used   map[string]bool   // build args an ARG declared
	// env is what ENV set so far: substituted in later instructions.
	env     map[string]string
	workdir string
	stage   bool // FROM seen
	sawCmd  bool // a CMD came before (an ENTRYPOINT then keeps it)
}

func (p *parser) instruction(in instruction) error {
	if strings.Contains(in.args, "<<") && (in.cmd == "RUN" || in.cmd == "COPY" || in.cmd == "ADD") && heredoc(in.args) {
		return unsupported("heredocs are not supported; put the script in a file and COPY it, or use RUN with && and \\ continuations")
	}
	if in.cmd != "ARG" && in.cmd != "FROM" && !p.stage {
		return unsupported("the first instruction must be FROM (or ARG before it)")
	}
	switch in.cmd {
	case "FROM":
		return p.from(in)
	case "ARG":
		return p.arg(in)
	case "RUN":
		return p.run(in)
	case "COPY", "ADD":
		return p.copy(in)
	case "ENV":
		return p.envInstr(in)
	case "WORKDIR":
		return p.workdirInstr(in)
	case "USER":
		return p.user(in)
	case "CMD", "ENTRYPOINT":
		return p.command(in)
	}
	return unsupported(fmt.Sprintf("instruction %s is not supported (forkd builds FROM, RUN, COPY, ADD of local files, ENV, WORKDIR, USER, ARG, CMD and ENTRYPOINT); remove it", in.cmd))
}

func unsupported(msg string) error {
	return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
}

// heredoc reports a heredoc marker as BuildKit finds one: a shell word,
// not in quotes, that is <<WORD or <<-WORD (optionally after a file
// descriptor number, the word optionally quoted). A shift in arithmetic
// ($((1<<x))), a here-string (<<<) or "<<EOF" in quotes is none.
func heredoc(s string) bool {
	for _, w := range shellWords(s) {
		if m := heredocWord.FindStringSubmatch(w); m != nil && strings.Trim(m[1], `"'`) != "" {
			return true
		}
	}
	return false
}

var heredocWord = regexp.MustCompile(`^[0-9]*<<-?([^<]*)$`)

// shellWords splits s at unquoted white space; a word that starts inside
// quotes is left out (it is text, not an operator).
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote byte
	quotedStart, inWord := false, false
	end := func() {
		if inWord && !quotedStart {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord, quotedStart = false, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' && i+1 < len(s) {
				cur.WriteByte(c)
				i++
				c = s[i]
			}
		case c == ' ' || c == '\t' || c == '\n':
			end()
			continue
		case c == '\'' || c == '"':
			if !inWord {
				quotedStart = true
			}
			quote = c
		case c == '\\' && i+1 < len(s):
			cur.WriteByte(c)
			i++
			c = s[i]
		}
		inWord = true
		cur.WriteByte(c)
	}
	end()
	return words
}

func (p *parser) from(in instruction) error {
	if p.stage {
		return unsupported("a second FROM: multi-stage builds are not supported")
	}
	f := strings.Fields(in.args)
	if len(f) > 0 && strings.HasPrefix(f[0], "--") {
		return unsupported(fmt.Sprintf("flag %s is not supported", f[0]))
	}
	if len(f) == 3 && strings.EqualFold(f[1], "AS") {
		f = f[:1] // a stage name means nothing with one stage
	}
	if len(f) != 1 {
		return unsupported("want FROM IMAGE[:TAG|@DIGEST] [AS NAME]")
	}
	ref, err := p.expand(f[0])
	if err != nil {
		return err
	}
	if ref == "" || ref == "scratch" {
		return unsupported("FROM scratch is not supported: start from an image with /bin/sh")
	}
	p.out.From, p.stage = ref, true
	p.global, p.args = p.args, map[string]string{}
	p.env = map[string]string{}
	return nil
}

func (p *parser) arg(in instruction) error {
	f := strings.Fields(in.args)
	if len(f) != 1 {
		return unsupported("want ARG NAME[=DEFAULT] (one per instruction)")
	}
	k, def, hasDef := strings.Cut(f[0], "=")
	if !validKey(k) {
		return unsupported(fmt.Sprintf("ARG name %q: want letters, digits and '_'", k))
	}
	v, given := p.given[k]
	if given {
		p.used[k] = true
	} else if hasDef {
		var err error
		if v, err = p.expand(unquote(def)); err != nil {
			return err
		}
	} else if old, ok := p.global[k]; ok && p.stage {
		v = old // declared before FROM, declared again after it
	}
	p.args[k] = v
	return nil
}

func (p *parser) run(in instruction) error {
	if strings.HasPrefix(in.args, "--") {
		return unsupported(fmt.Sprintf("flag %s is not supported", strings.Fields(in.args)[0]))
	}
	s := recipe.Step{Kind: recipe.StepRun, Origin: p.origin(in)}
	if argv, ok, err := execForm(in.args); err != nil {
		return err
	} else if ok {
		if len(argv) == 0 {
			return unsupported("RUN [] runs nothing")
		}
		s.Argv = argv
	} else {
		if in.args == "" {
			return unsupported("RUN without a command")
		}
		s.Shell = in.args
	}
	if len(p.args) > 0 {
		// ARG values are the command's environment, not the image's.
		s.BuildEnv = map[string]string{}
		for k, v := range p.args {
			if _, set := p.env[k]; !set {
				s.BuildEnv[k] = v
			}
		}
	}
	p.out.Steps = append(p.out.Steps, s)
	return nil
}

func (p *parser) copy(in instruction) error {
	words, err := p.words(in.args)
	if err != nil {
		return err
	}
	for len(words) > 0 && strings.HasPrefix(words[0], "--") {
		flag, _, _ := strings.Cut(words[0], "=")
		switch flag {
		case "--from":
			return unsupported("COPY --from: multi-stage builds are not supported")
		case "--chown", "--chmod", "--link", "--parents", "--exclude", "--checksum", "--keep-git-dir":
			return unsupported(fmt.Sprintf("flag %s is not supported", flag))
		}
		return unsupported(fmt.Sprintf("unknown flag %s", flag))
	}
	if len(words) < 2 {
		return unsupported(fmt.Sprintf("want %s SRC... DEST", in.cmd))
	}
	src, dst := words[:len(words)-1], words[len(words)-1]
	for i, s := range src {
		if in.cmd == "ADD" {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return unsupported(fmt.Sprintf("ADD of a URL (%s) is not supported: download it in a RUN step", s))
			}
			if isArchive(s) {
				return unsupported(fmt.Sprintf("ADD of a local archive (%s) is not supported (Docker would extract it): COPY it and extract it in a RUN step", s))
			}
		}
		if strings.ContainsAny(s, "*?[") {
			return unsupported(fmt.Sprintf("source %q: wildcards are not supported; name files or directories", s))
		}
		c, err := recipe.ContextPath(s)
		if err != nil {
			return err
		}
		src[i] = c
	}
	if !strings.HasPrefix(dst, "/") {
		// Relative to the working directory, as Docker resolves it.
		dst = path.Join(p.wd(), dst) + map[bool]string{true: "/"}[strings.HasSuffix(dst, "/") || dst == "."]
	}
	p.out.Steps = append(p.out.Steps, recipe.Step{Kind: recipe.StepCopy, Origin: p.origin(in), Src: src, Dst: dst})
	return nil
}

func isArchive(s string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(strings.ToLower(s), ext) {
			return true
		}
	}
	return false
}

func (p *parser) envInstr(in instruction) error {
	words, err := p.words(in.args)
	if err != nil {
		return err
	}
	var pairs [][2]string
	if len(words) > 0 && !strings.Contains(words[0], "=") {
		// The legacy form: ENV KEY VALUE WITH SPACES.
		k, v, _ := strings.Cut(in.args, " ")
		val, err := p.expand(unquote(strings.TrimSpace(v)))
		if err != nil {
			return err
		}
		pairs = append(pairs, [2]string{k, val})
	} else {
		for _, w := range words {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return unsupported(fmt.Sprintf("%q: want KEY=VALUE", w))
			}
			pairs = append(pairs, [2]string{k, v})
		}
	}
	if len(pairs) == 0 {
		return unsupported("want ENV KEY=VALUE ...")
	}
	for _, kv := range pairs {
		if !validKey(kv[0]) {
			return unsupported(fmt.Sprintf("variable name %q: want letters, digits and '_'", kv[0]))
		}
		p.env[kv[0]] = kv[1]
		p.out.Steps = append(p.out.Steps, recipe.Step{Kind: recipe.StepEnv, Origin: p.origin(in), Key: kv[0], Value: kv[1]})
	}
	return nil
}

func (p *parser) workdirInstr(in instruction) error {
	words, err := p.words(in.args)
	if err != nil {
		return err
	}
	if len(words) != 1 {
		return unsupported("want WORKDIR PATH")
	}
	d := words[0]
	if !strings.HasPrefix(d, "/") {
		d = path.Join(p.wd(), d)
	}
	p.workdir = path.Clean(d)
	p.out.Steps = append(p.out.Steps, recipe.Step{Kind: recipe.StepWorkdir, Origin: p.origin(in), Value: p.workdir})
	return nil
}

func (p *parser) user(in instruction) error {
	words, err := p.words(in.args)
	if err != nil {
		return err
	}
	if len(words) != 1 {
		return unsupported("want USER NAME[:GROUP] or UID[:GID]")
	}
	p.out.Steps = append(p.out.Steps, recipe.Step{Kind: recipe.StepUser, Origin: p.origin(in), Value: words[0]})
	return nil
}

// command reads CMD or ENTRYPOINT: the image's default command, which
// `forkd run` without a command runs. The exec form is kept as is; the
// shell form becomes /bin/sh -c (variables are the shell's to expand, at
// run time, as Docker leaves them).
func (p *parser) command(in instruction) error {
	s := recipe.Step{Kind: recipe.StepCmd, Origin: p.origin(in)}
	if in.cmd == "ENTRYPOINT" {
		s.Kind = recipe.StepEntrypoint
		if !p.sawCmd {
			s.Value = recipe.ResetCmd
		}
	} else {
		p.sawCmd = true
	}
	if argv, ok, err := execForm(in.args); err != nil {
		return err
	} else if ok {
		s.Argv = argv
	} else if in.args != "" {
		s.Argv = []string{"/bin/sh", "-c", in.args}
	}
	p.out.Steps = append(p.out.Steps, s)
	return nil
}

func (p *parser) wd() string {
	if p.workdir == "" {
		return "/"
	}
	return p.workdir
}

func (p *parser) origin(in instruction) string {
	return fmt.Sprintf("%s:%d %s", p.name, in.line, in.cmd)
}

// execForm parses a JSON array of strings (RUN ["a", "b"]); ok is false
// for anything that is not one, which Docker runs in the shell form.
func execForm(s string) (argv []string, ok bool, err error) {
	if !strings.HasPrefix(s, "[") {
		return nil, false, nil
	}
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return nil, false, nil
	}
	return argv, true, nil
}

func validKey(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Recipe is the recipe that builds f: from its FROM, with its steps and
// the build context's files (the ones its COPY and ADD name). source is
// the Dockerfile's bytes (the recipe's digest); name the recipe's name
// ("" : "dockerfile").
func (f *File) Recipe(name string, source []byte, insecureRegistry bool, context map[string]recipe.ContextFile) (*recipe.Recipe, error) {
	if name == "" {
		name = "dockerfile"
	}
	steps := f.Steps
	if steps == nil {
		steps = []recipe.Step{} // no steps: not derived from recipe fields either
	}
	r := &recipe.Recipe{Name: name, From: f.From, InsecureRegistry: insecureRegistry, Steps: steps, Context: context,
		Path: "Dockerfile", Source: source}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}
