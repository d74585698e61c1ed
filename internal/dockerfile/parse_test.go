package dockerfile

import (
	"reflect"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

func TestParseSubset(t *testing.T) {
	src := `# syntax=docker/dockerfile:1
ARG TAG=3.20
FROM registry.test/alpine:${TAG} AS base
ARG TAG
ARG GREETING=hello
# a comment between instructions
ENV APP=/srv/app \
    # a comment inside a continuation is dropped
    MODE="fast mode" LITERAL='$APP'
ENV LEGACY value with spaces
WORKDIR $APP
WORKDIR sub
COPY main.py ./
COPY ["dir with space", "${APP}/data/"]
ADD ./conf /etc/conf
USER 1000:1000
RUN echo "$GREETING" && \
    touch /tmp/x
RUN ["/bin/sh", "-c", "echo exec form"]
`
	f, err := Parse("Dockerfile", []byte(src), map[string]string{"GREETING": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if f.From != "registry.test/alpine:3.20" {
		t.Fatalf("from %q", f.From)
	}
	args := map[string]string{"TAG": "3.20", "GREETING": "hi"}
	want := []recipe.Step{
		{Kind: recipe.StepEnv, Origin: "Dockerfile:7 ENV", Key: "APP", Value: "/srv/app"},
		{Kind: recipe.StepEnv, Origin: "Dockerfile:7 ENV", Key: "MODE", Value: "fast mode"},
		{Kind: recipe.StepEnv, Origin: "Dockerfile:7 ENV", Key: "LITERAL", Value: "$APP"},
		{Kind: recipe.StepEnv, Origin: "Dockerfile:10 ENV", Key: "LEGACY", Value: "value with spaces"},
		{Kind: recipe.StepWorkdir, Origin: "Dockerfile:11 WORKDIR", Value: "/srv/app"},
		{Kind: recipe.StepWorkdir, Origin: "Dockerfile:12 WORKDIR", Value: "/srv/app/sub"},
		{Kind: recipe.StepCopy, Origin: "Dockerfile:13 COPY", Src: []string{"main.py"}, Dst: "/srv/app/sub/"},
		{Kind: recipe.StepCopy, Origin: "Dockerfile:14 COPY", Src: []string{"dir with space"}, Dst: "/srv/app/data/"},
		{Kind: recipe.StepCopy, Origin: "Dockerfile:15 ADD", Src: []string{"conf"}, Dst: "/etc/conf"},
		{Kind: recipe.StepUser, Origin: "Dockerfile:16 USER", Value: "1000:1000"},
		{Kind: recipe.StepRun, Origin: "Dockerfile:17 RUN", Shell: `echo "$GREETING" &&  touch /tmp/x`, BuildEnv: args},
		{Kind: recipe.StepRun, Origin: "Dockerfile:19 RUN", Argv: []string{"/bin/sh", "-c", "echo exec form"}, BuildEnv: args},
	}
	if !reflect.DeepEqual(f.Steps, want) {
		for i := range max(len(f.Steps), len(want)) {
			var g, w recipe.Step
			if i < len(f.Steps) {
				g = f.Steps[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("step %d:\n got %+v\nwant %+v", i, g, w)
			}
		}
	}
	for _, s := range f.Steps {
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", s.Origin, err)
		}
	}
}

func TestParseRefusesWhatItDoesNotBuild(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"FROM a\nRUN x\nHEALTHCHECK NONE\n", "Dockerfile:3 HEALTHCHECK: instruction HEALTHCHECK is not supported"},
		{"FROM a\nEXPOSE 80\n", "Dockerfile:2 EXPOSE"},
		{"FROM a\nFROM b\n", "Dockerfile:2 FROM: a second FROM: multi-stage"},
		{"FROM a\nCOPY --from=b /x /y\n", "Dockerfile:2 COPY: COPY --from"},
		{"FROM a\nCOPY --chown=1:1 x /y\n", "flag --chown is not supported"},
		{"FROM a\nADD https://example.test/x /y\n", "Dockerfile:2 ADD: ADD of a URL"},
		{"FROM a\nADD app.tar.gz /y\n", "ADD of a local archive"},
		{"FROM a\nRUN <<EOF\necho hi\nEOF\n", "Dockerfile:2 RUN: heredocs are not supported"},
		{"FROM a\nRUN --mount=type=cache,target=/x true\n", "flag --mount=type=cache,target=/x is not supported"},
		{"FROM a\nCOPY ../secret /x\n", "inside the build context"},
		{"FROM a\nCOPY *.py /x/\n", "wildcards"},
		{"RUN x\n", "Dockerfile:1 RUN: the first instruction must be FROM"},
		{"# escape=`\nFROM a\n", "escape directive"},
		{"ARG X\n", "no FROM"},
		{"FROM scratch\n", "FROM scratch"},
		{"FROM a\nENV 1X=y\n", "variable name"},
		{"FROM a\nWORKDIR ${X:?err}\n", "only ${VAR}"},
	} {
		_, err := Parse("Dockerfile", []byte(c.src), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: got %v, want an invalid-argument error containing %q", c.src, err, c.want)
		}
	}
	if _, err := Parse("Dockerfile", []byte("FROM a\n"), map[string]string{"NOPE": "1"}); err == nil || !strings.Contains(err.Error(), `"NOPE" is not declared`) {
		t.Errorf("an undeclared --build-arg: %v", err)
	}
}

// TestDefaultCommand: CMD and ENTRYPOINT, exec and shell forms, become
// steps; an ENTRYPOINT with no CMD before it clears the base's Cmd.
func TestDefaultCommand(t *testing.T) {
	f, err := Parse("Dockerfile", []byte("FROM a\nENTRYPOINT [\"python3\", \"-m\", \"app\"]\nCMD --port 80\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []recipe.Step{
		{Kind: recipe.StepEntrypoint, Origin: "Dockerfile:2 ENTRYPOINT", Argv: []string{"python3", "-m", "app"}, Value: recipe.ResetCmd},
		{Kind: recipe.StepCmd, Origin: "Dockerfile:3 CMD", Argv: []string{"/bin/sh", "-c", "--port 80"}},
	}
	if !reflect.DeepEqual(f.Steps, want) {
		t.Fatalf("steps %+v, want %+v", f.Steps, want)
	}
	f, err = Parse("Dockerfile", []byte("FROM a\nCMD [\"serve\"]\nENTRYPOINT [\"/init\"]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := f.Steps[1]; e.Kind != recipe.StepEntrypoint || e.Value != "" {
		t.Fatalf("an ENTRYPOINT after a CMD: %+v, want it to keep the CMD", e)
	}
	for _, s := range f.Steps {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
}

// TestHeredocMarkers: what BuildKit reads as a heredoc is refused; shifts,
// here-strings and quoted text are not heredocs.
func TestHeredocMarkers(t *testing.T) {
	for in, want := range map[string]bool{
		"<<EOF":                          true,
		"cat <<-EOF":                     true,
		`python3 <<"PY"`:                 true,
		"cat 0<<'X' > f":                 true,
		"echo $((1<<x))":                 false,
		"echo $(( 1 << 2 ))":             false,
		"cat <<<word":                    false,
		`echo "<<EOF"`:                   false,
		`echo '<<EOF' and "a <<b"`:       false,
		`python3 -c "print(1<<x)" <<EOF`: true,
		`printf '%s\n' 'it''s' && ls`:    false,
	} {
		if got := heredoc(in); got != want {
			t.Errorf("heredoc(%q) = %v, want %v", in, got, want)
		}
	}
	if _, err := Parse("Dockerfile", []byte("FROM a\nRUN echo $((1<<x)) > /n\n"), nil); err != nil {
		t.Errorf("a shift in arithmetic: %v", err)
	}
}

func TestExpand(t *testing.T) {
	p := &parser{env: map[string]string{"A": "1", "EMPTY": ""}, args: map[string]string{"B": "2"}}
	for in, want := range map[string]string{
		"$A-${B}":          "1-2",
		"${EMPTY:-dflt}":   "dflt",
		"${A:-dflt}":       "1",
		"${A:+alt}":        "alt",
		"${UNSET:+alt}x":   "x",
		`\$A`:              "$A",
		"cost $":           "cost $",
		"${UNSET:-${B}}/x": "2/x",
	} {
		got, err := p.expand(in)
		if err != nil || got != want {
			t.Errorf("expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
