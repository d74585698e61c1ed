package progress

import "io"

// Reader returns r counting the bytes read from it into the current step:
// Bytes(n, total) after each read (total < 0: unknown).
func (rep *Reporter) Reader(r io.Reader, total int64) io.Reader {
	return &countReader{r: r, rep: rep, total: total}
}

// Writer returns w counting the bytes written to it into the current
// step, as Reader does.
func (rep *Reporter) Writer(w io.Writer, total int64) io.Writer {
	return &countWriter{w: w, rep: rep, total: total}
}

type countReader struct {
	r     io.Reader
	rep   *Reporter
	n     int64
	total int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.rep.Bytes(c.n, c.total)
	}
	return n, err
}

type countWriter struct {
	w     io.Writer
	rep   *Reporter
	n     int64
	total int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if n > 0 {
		c.n += int64(n)
		c.rep.Bytes(c.n, c.total)
	}
	return n, err
}
