package fsutil

import "golang.org/x/sys/unix"

// HugePageSize returns the page size of the hugetlbfs that holds dir, or
// 0 when dir is on another file system.
func HugePageSize(dir string) (int64, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, err
	}
	if sfs.Type != unix.HUGETLBFS_MAGIC {
		return 0, nil
	}
	return int64(sfs.Bsize), nil
}
