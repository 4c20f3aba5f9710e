package modcheck

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repo is the path of this repository's root module: every module of the
// repository is it or a path below it.
const repo = "github.com/epcache/epcache"

// A require of a module of this repository, with the go.mod it is in.
type require struct {
	gomod, path, version string
}

// requires returns what the go.mod file at p requires of this repository's
// modules. It reads the file itself (a require line, or a line of a
// require block), so that the root module needs no golang.org/x/mod.
func requires(t *testing.T, p string) []require {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reqs []require
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "require (":
			inBlock = true
			continue
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimSpace(strings.TrimPrefix(line, "require "))
		case !inBlock:
			continue
		}
		fields := strings.Fields(line)
		if len(fields) == 2 && (fields[0] == repo || strings.HasPrefix(fields[0], repo+"/")) {
			reqs = append(reqs, require{p, fields[0], fields[1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return reqs
}

// goMods returns the go.mod files of the repository at root that git
// tracks.
func goMods(t *testing.T, root string) []string {
	out, err := exec.Command("git", "-C", root, "ls-files", "--", "go.mod", "*/go.mod").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	var mods []string
	for _, f := range strings.Fields(string(out)) {
		mods = append(mods, filepath.Join(root, f))
	}
	return mods
}

// released returns the releases CHANGELOG.md records, as the set of
// "module@version" it lists in each release's table of modules and tags,
// and checks each row's tag against its module's path.
func released(t *testing.T, root string) map[string]bool {
	text, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile(`^## \[(\d+\.\d+\.\d+)\]`)
	row := regexp.MustCompile("^\\| `([^`]+)` \\| `([^`]+)` \\|")
	rels := map[string]bool{}
	version := ""
	for _, line := range strings.Split(string(text), "\n") {
		if m := section.FindStringSubmatch(line); m != nil {
			version = "v" + m[1]
			continue
		}
		if strings.HasPrefix(line, "## ") {
			version = "" // Unreleased
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil || version == "" {
			continue
		}
		mod, tag := m[1], m[2]
		want := version
		if mod != repo {
			want = strings.TrimPrefix(mod, repo+"/") + "/" + version
		}
		if tag != want {
			t.Errorf("CHANGELOG.md, release %s: module %s is tagged %s; its tag must be %s", version, mod, tag, want)
		}
		rels[mod+"@"+version] = true
	}
	return rels
}

// Every module of this repository that requires another of them requires a
// version that a release made (its entry in CHANGELOG.md), never v0.0.0 or
// a pseudo-version: a consumer's build ignores the replace lines that
// build the modules together here, and fetches the version required. And
// every module a release lists is a module of this repository.
func TestModulesRequireReleasedVersions(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	rels := released(t, root)
	if len(rels) == 0 {
		t.Fatal("CHANGELOG.md records no release")
	}
	pseudo := regexp.MustCompile(`^v0\.0\.0(-|$)|-\d{14}-[0-9a-f]{12}$`)
	paths := map[string]bool{}
	for _, p := range goMods(t, root) {
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		paths[path.Join(repo, filepath.ToSlash(rel))] = true
		for _, r := range requires(t, p) {
			name, _ := filepath.Rel(root, r.gomod)
			switch {
			case pseudo.MatchString(r.version):
				t.Errorf("%s requires %s %s: no release will ever have that version; require a released one (CHANGELOG.md) and keep the replace for building here", name, r.path, r.version)
			case !rels[r.path+"@"+r.version]:
				t.Errorf("%s requires %s %s, which CHANGELOG.md records in no release", name, r.path, r.version)
			}
		}
	}
	for rel := range rels {
		if mod, _, _ := strings.Cut(rel, "@"); !paths[mod] {
			t.Errorf("CHANGELOG.md releases %s, which is not a module of this repository", rel)
		}
	}
}
