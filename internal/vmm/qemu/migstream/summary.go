package migstream

import "io"

// Summary describes a stream's structure, for tests and debugging.
type Summary struct {
	Config     *Config
	RAMID      uint32 // section id of the "ram" handler
	Blocks     []BlockInfo
	Pages      map[string]int // page records per block (PAGE and ZERO)
	Sections   []SectionHeader
	DeviceTail int64 // bytes from the first device section on
}

// Summarize reads a stream up to its device sections, which it counts,
// and describes it. It accepts only "ram" sections before them.
func Summarize(r io.Reader) (*Summary, error) {
	sr := NewReader(r)
	if err := sr.Header(); err != nil {
		return nil, err
	}
	sum := &Summary{Pages: map[string]int{}}
	ignoreShared := false
	for {
		t, err := sr.SectionType()
		if err != nil {
			return sum, err
		}
		switch t {
		case SectionConfiguration:
			c, err := sr.Config()
			if err != nil {
				return sum, err
			}
			sum.Config = &c
			ignoreShared = c.IgnoreShared()
		case SectionStart, SectionPart, SectionEnd:
			h, err := sr.SectionHeader(t)
			if err != nil {
				return sum, err
			}
			sum.Sections = append(sum.Sections, h)
			if t == SectionStart {
				if h.Name != RAMSection {
					return sum, errorf("start section %q", h.Name)
				}
				sum.RAMID = h.ID
			}
			for {
				rec, err := sr.Record()
				if err != nil {
					return sum, err
				}
				flags := rec.Flags &^ FlagContinue
				if flags == FlagEOS {
					break
				}
				if flags == FlagMemSize {
					if sum.Blocks, err = sr.BlockList(rec.Offset, ignoreShared); err != nil {
						return sum, err
					}
					continue
				}
				sum.Pages[rec.Block]++
			}
			if _, err := sr.Footer(h.ID); err != nil {
				return sum, err
			}
		case SectionFull, SectionEOF:
			sum.Sections = append(sum.Sections, SectionHeader{Type: t})
			k, err := io.Copy(io.Discard, sr)
			sum.DeviceTail = k + 1
			return sum, err
		default:
			return sum, errorf("section type %#x at byte %d", t, sr.Offset()-1)
		}
	}
}
