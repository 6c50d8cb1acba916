//! A metric's present cells as a list of `(step, value)` points that the detectors index
//! and walk, read in place from the frame's column: a long log's metric is no longer
//! copied into a fresh `Vec<(step, value)>` by every detector that reads it (a 14 M-step
//! metric was a 224 MB copy, each in pages the kernel clears). Points the caller filtered
//! or derived are held as a list, behind the same interface.

use crate::frames::log::column::{Column, Present, Steps};

/// The points `(step, value)` of one metric, in row order, indexed from 0.
#[derive(Debug, Clone)]
pub struct Series<'a>(Inner<'a>);

#[derive(Debug, Clone)]
enum Inner<'a> {
    /// Cells `start..` of the present cells of `col` (`counts`: [`Column::present_counts`]).
    Cells {
        col: &'a Column,
        steps: &'a Steps,
        counts: Vec<usize>,
        start: usize,
    },
    /// Points held as a list.
    Owned(Vec<(i64, f64)>),
    /// Points of a list held elsewhere.
    Slice(&'a [(i64, f64)]),
}

impl<'a> Series<'a> {
    /// The present cells of `col`, each at the step of its row.
    pub fn cells(col: &'a Column, steps: &'a Steps) -> Series<'a> {
        Series(Inner::Cells {
            col,
            steps,
            counts: col.present_counts(),
            start: 0,
        })
    }

    /// Points held as a list.
    pub fn owned(points: Vec<(i64, f64)>) -> Series<'static> {
        Series(Inner::Owned(points))
    }

    /// No point.
    pub fn empty() -> Series<'static> {
        Series::owned(Vec::new())
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        match &self.0 {
            Inner::Cells { counts, start, .. } => {
                counts.last().copied().unwrap_or(0).saturating_sub(*start)
            }
            Inner::Owned(v) => v.len(),
            Inner::Slice(v) => v.len(),
        }
    }

    /// True when there is no point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point `i` (`None` past the end).
    pub fn get(&self, i: usize) -> Option<(i64, f64)> {
        match &self.0 {
            Inner::Cells { col, steps, .. } => {
                let row = self.row_of(i)?;
                Some((steps.get(row).unwrap_or(i64::MIN), col.get(row)?))
            }
            Inner::Owned(v) => v.get(i).copied(),
            Inner::Slice(v) => v.get(i).copied(),
        }
    }

    /// The first point.
    pub fn first(&self) -> Option<(i64, f64)> {
        self.get(0)
    }

    /// The last point.
    pub fn last(&self) -> Option<(i64, f64)> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Every point, in order.
    pub fn iter(&self) -> Points<'_> {
        self.range(0, self.len())
    }

    /// Points `a..b` (clamped to the series), in order.
    pub fn range(&self, a: usize, b: usize) -> Points<'_> {
        let b = b.min(self.len());
        let a = a.min(b);
        match &self.0 {
            Inner::Cells { col, steps, .. } => {
                // The row of the first point; past the end, the column's length.
                let row = if a < b {
                    self.row_of(a).unwrap_or(col.len())
                } else {
                    col.len()
                };
                Points(PointsInner::Cells {
                    present: col.present_from(row),
                    steps,
                    left: b - a,
                })
            }
            Inner::Owned(v) => Points(PointsInner::Slice(v.get(a..b).unwrap_or_default().iter())),
            Inner::Slice(v) => Points(PointsInner::Slice(v.get(a..b).unwrap_or_default().iter())),
        }
    }

    /// The row of point `i` (cells only; `None` past the end).
    fn row_of(&self, i: usize) -> Option<usize> {
        let Inner::Cells {
            col, counts, start, ..
        } = &self.0
        else {
            return None;
        };
        let j = start.checked_add(i)?;
        if j >= *counts.last()? {
            return None;
        }
        // The block holding cell j: the last whose count before it is <= j.
        let b = counts.partition_point(|&c| c <= j).checked_sub(1)?;
        col.nth_present_row(b, j - counts.get(b)?)
    }

    /// The points from `a` on, as a series indexed from 0.
    pub fn tail(&self, a: usize) -> Series<'_> {
        let a = a.min(self.len());
        match &self.0 {
            Inner::Cells {
                col,
                steps,
                counts,
                start,
            } => Series(Inner::Cells {
                col,
                steps,
                counts: counts.clone(),
                start: start + a,
            }),
            Inner::Owned(v) => Series(Inner::Slice(v.get(a..).unwrap_or_default())),
            Inner::Slice(v) => Series(Inner::Slice(v.get(a..).unwrap_or_default())),
        }
    }

    /// The values, in order.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// The points as a list (for tests and small series).
    pub fn to_vec(&self) -> Vec<(i64, f64)> {
        self.iter().collect()
    }
}

/// The points of a [`Series`] range, in order.
#[derive(Debug, Clone)]
pub struct Points<'s>(PointsInner<'s>);

#[derive(Debug, Clone)]
enum PointsInner<'s> {
    Cells {
        present: Present<'s>,
        steps: &'s Steps,
        left: usize,
    },
    Slice(std::slice::Iter<'s, (i64, f64)>),
}

impl Iterator for Points<'_> {
    type Item = (i64, f64);

    #[inline]
    fn next(&mut self) -> Option<(i64, f64)> {
        match &mut self.0 {
            PointsInner::Cells {
                present,
                steps,
                left,
            } => {
                *left = left.checked_sub(1)?;
                let (row, v) = present.next()?;
                Some((steps.get(row).unwrap_or(i64::MIN), v))
            }
            PointsInner::Slice(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.0 {
            PointsInner::Cells { left, .. } => *left,
            PointsInner::Slice(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Points<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::log::column::BLOCK_ROWS;

    /// A column with holes, constants (line blocks), NaN, a sparse block, a full dense
    /// block and a partial last block; steps with a gap.
    fn column() -> (Column, Steps, Vec<(i64, f64)>) {
        let n = 6 * BLOCK_ROWS + 77;
        let cell = |i: usize| -> Option<f64> {
            match i / BLOCK_ROWS {
                0 if i % 7 == 3 => None,
                0 => Some(i as f64 * 0.37),
                1 => Some(2.5),
                2 if i.is_multiple_of(300) => Some(i as f64),
                2 => None,
                3 => Some((i as f64).sin()),
                4 => None,
                _ if i.is_multiple_of(3) => Some(f64::NAN),
                _ if i % 3 == 1 => None,
                _ => Some(-0.0),
            }
        };
        let col = Column::from_cells((0..n).map(cell));
        let steps: Steps = (0..n as i64)
            .map(|i| if i < 5000 { i } else { i * 2 + 7 })
            .collect();
        let want: Vec<(i64, f64)> = (0..n)
            .filter_map(|i| cell(i).map(|v| (steps.get(i).unwrap(), v)))
            .collect();
        (col, steps, want)
    }

    fn bits(p: &[(i64, f64)]) -> Vec<(i64, u64)> {
        p.iter().map(|(s, v)| (*s, v.to_bits())).collect()
    }

    #[test]
    fn cells_read_in_place_equal_the_copied_points() {
        let (col, steps, want) = column();
        let s = Series::cells(&col, &steps);
        assert_eq!(s.len(), want.len());
        assert_eq!(bits(&s.to_vec()), bits(&want));
        for (i, p) in want.iter().enumerate() {
            assert_eq!(bits(&[s.get(i).unwrap()]), bits(&[*p]), "point {i}");
        }
        assert_eq!(s.get(want.len()), None);
        assert_eq!(bits(&[s.last().unwrap()]), bits(&want[want.len() - 1..]));
        // Ranges starting anywhere (inside runs of full blocks, at block edges, in holes).
        for a in (0..=want.len())
            .step_by(97)
            .chain([0, 1, 4095, 4096, want.len()])
        {
            for len in [0, 1, 2, 500, 5000, usize::MAX / 2] {
                let b = a.saturating_add(len);
                let got: Vec<(i64, f64)> = s.range(a, b).collect();
                let end = b.min(want.len());
                assert_eq!(bits(&got), bits(&want[a..end]), "range {a}..{b}");
                assert_eq!(s.range(a, b).len(), end - a);
            }
            let tail = s.tail(a);
            assert_eq!(bits(&tail.to_vec()), bits(&want[a..]), "from {a}");
            if a < want.len() {
                assert_eq!(bits(&[tail.get(0).unwrap()]), bits(&want[a..=a]));
            }
        }
        // The same through a list.
        let o = Series::owned(want.clone());
        assert_eq!(bits(&o.tail(3).to_vec()), bits(&want[3..]));
        assert_eq!(bits(&o.range(2, 9).collect::<Vec<_>>()), bits(&want[2..9]));
    }

    #[test]
    fn an_empty_column_and_a_constant_one() {
        let steps: Steps = (0..10).collect();
        let none = Column::from_cells((0..10).map(|_| None));
        let s = Series::cells(&none, &steps);
        assert!(s.is_empty());
        assert_eq!(s.iter().count(), 0);
        assert_eq!(s.first(), None);
        let c = Column::from_cells((0..10).map(|_| Some(1.5)));
        let s = Series::cells(&c, &steps);
        assert_eq!(s.to_vec(), (0..10).map(|i| (i, 1.5)).collect::<Vec<_>>());
    }
}
