package handler

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
)

// guestPath validates a path from a request: absolute and clean, so no
// request depends on the agent's working directory.
func guestPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("missing path: %w", errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	return filepath.Clean(p), nil
}

func fileInfo(path string, fi fs.FileInfo) agentapi.FileInfo {
	return agentapi.FileInfo{
		Name:    fi.Name(),
		Path:    path,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		IsDir:   fi.IsDir(),
		IsLink:  fi.Mode()&fs.ModeSymlink != 0,
		ModTime: fi.ModTime().UTC(),
	}
}

// lstat describes path itself (a symlink is reported as a link).
func lstat(path string) (agentapi.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	return fileInfo(path, fi), nil
}

func (a *Agent) handleReadFile(w http.ResponseWriter, r *http.Request) {
	path, err := guestPath(r.URL.Query().Get("path"))
	if err != nil {
		writeProblem(w, err)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeProblem(w, fsError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeProblem(w, fsError(err))
		return
	}
	if fi.IsDir() {
		writeProblem(w, fmt.Errorf("%q is a directory; list it with %s: %w", path, agentapi.PathFilesList, errdefs.ErrInvalidArgument))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi.Mode().IsRegular() {
		// Files of /proc and /sys report size 0 but have content: only a
		// regular file's size is a promise.
		if fi.Size() > 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		}
	}
	// A copy that fails midway leaves the response short of its
	// Content-Length (or without the final chunk), which the client reports
	// as an error: never a silently truncated file.
	if _, err := io.Copy(w, f); err != nil {
		a.cfg.Logf("reading %s: %v", path, err)
	}
}

func (a *Agent) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := guestPath(q.Get("path"))
	if err != nil {
		writeProblem(w, err)
		return
	}
	mode := fs.FileMode(0o644)
	if s := q.Get("mode"); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o7777 {
			writeProblem(w, fmt.Errorf("mode %q is not an octal permission (e.g. 0644): %w", s, errdefs.ErrInvalidArgument))
			return
		}
		mode = fs.FileMode(m&0o777) | unixModeBits(uint32(m))
	}
	fi, err := writeFileAtomic(path, mode, r.Body)
	if err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, fi)
}

// unixModeBits converts setuid/setgid/sticky from their octal positions to
// Go's fs.FileMode bits.
func unixModeBits(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// writeFileAtomic streams body to a temporary file next to path, syncs it
// and renames it into place: readers see the old file or the whole new one,
// never a part. The parent directory must exist.
func writeFileAtomic(path string, mode fs.FileMode, body io.Reader) (agentapi.FileInfo, error) {
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return agentapi.FileInfo{}, fmt.Errorf("parent directory %q does not exist (create it with %s): %w", dir, agentapi.PathFilesMkdir, errdefs.ErrNotFound)
		}
		return agentapi.FileInfo{}, fsError(err)
	} else if !fi.IsDir() {
		return agentapi.FileInfo{}, fmt.Errorf("parent %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return agentapi.FileInfo{}, fmt.Errorf("%q is a directory: %w", path, errdefs.ErrInvalidArgument)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".forkd-*")
	if err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, body); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) { // the write side failed (ENOSPC, ...)
			return agentapi.FileInfo{}, fsError(err)
		}
		return agentapi.FileInfo{}, fmt.Errorf("upload of %q cut short: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	// Chmod, not the create mode: the umask must not change what was asked.
	if err := tmp.Chmod(mode); err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	if err := tmp.Sync(); err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	if err := tmp.Close(); err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return agentapi.FileInfo{}, fsError(err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil { // make the rename durable too
		d.Sync()
		d.Close()
	}
	return lstat(path)
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := guestPath(q.Get("path"))
	if err != nil {
		writeProblem(w, err)
		return
	}
	if path == "/" {
		writeProblem(w, fmt.Errorf("refusing to remove /: %w", errdefs.ErrInvalidArgument))
		return
	}
	recursive, err := httpquery.Bool(q, "recursive", false)
	if err != nil {
		writeProblem(w, err)
		return
	}
	if _, err := os.Lstat(path); err != nil {
		writeProblem(w, fsError(err))
		return
	}
	if recursive {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		if !recursive && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			err = fmt.Errorf("directory %q is not empty (remove it with recursive=1): %w", path, errdefs.ErrFailedPrecondition)
		}
		writeProblem(w, fsError(err))
		return
	}
	writeJSON(w, struct{}{})
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	path, err := guestPath(r.URL.Query().Get("path"))
	if err != nil {
		writeProblem(w, err)
		return
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		writeProblem(w, fsError(err))
		return
	}
	out := make([]agentapi.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue // removed while listing
		}
		out = append(out, fileInfo(filepath.Join(path, e.Name()), fi))
	}
	writeJSON(w, out)
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	path, err := guestPath(r.URL.Query().Get("path"))
	if err != nil {
		writeProblem(w, err)
		return
	}
	fi, err := lstat(path)
	if err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, fi)
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req agentapi.MkdirRequest
	if err := readJSON(w, r, &req); err != nil {
		writeProblem(w, err)
		return
	}
	path, err := guestPath(req.Path)
	if err != nil {
		writeProblem(w, err)
		return
	}
	mode := fs.FileMode(0o755)
	if req.Mode != 0 {
		if req.Mode > 0o7777 {
			writeProblem(w, fmt.Errorf("mode %#o is not a permission: %w", req.Mode, errdefs.ErrInvalidArgument))
			return
		}
		mode = fs.FileMode(req.Mode&0o777) | unixModeBits(req.Mode)
	}
	existed := false
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		existed = true
	}
	if req.Parents {
		err = os.MkdirAll(path, mode)
	} else {
		err = os.Mkdir(path, mode)
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("parent directory of %q does not exist (set parents): %w", path, errdefs.ErrNotFound)
		}
	}
	if err == nil && !existed {
		// The umask applied to the mkdir; the request's mode wins (but an
		// existing directory, with parents set, is left as it is).
		err = os.Chmod(path, mode)
	}
	if err != nil {
		writeProblem(w, fsError(err))
		return
	}
	fi, err := lstat(path)
	if err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, fi)
}
