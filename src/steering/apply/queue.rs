//! The job queue of one NIC thread. Producers append whole batches under one
//! lock and wake the thread only if it sleeps, so a burst of requests costs
//! one wake-up, not one per request; the thread takes everything queued at
//! once and reuses its buffer, so a steady load allocates nothing.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// What [`JobQueue::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Jobs were moved into the caller's buffer.
    Jobs,
    /// The deadline passed with nothing queued.
    Timeout,
    /// Closed and empty: the thread ends.
    Closed,
}

struct Inner<T> {
    jobs: Vec<T>,
    /// The consumer waits on the condition variable: the next producer wakes it.
    sleeping: bool,
    closed: bool,
}

pub(super) struct JobQueue<T> {
    inner: Mutex<Inner<T>>,
    wake: Condvar,
}

impl<T> JobQueue<T> {
    pub(super) fn new() -> Self {
        JobQueue {
            inner: Mutex::new(Inner { jobs: Vec::new(), sleeping: false, closed: false }),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // A panic while holding this lock leaves only plain Vec pushes half done: keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends every job of `batch` (leaving it empty, its capacity kept).
    /// Gives the batch back untouched when the queue is closed.
    pub(super) fn push_all(&self, batch: &mut Vec<T>) -> Result<(), ()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.add(|jobs| jobs.append(batch))
    }

    /// Appends one job; gives it back when the queue is closed.
    pub(super) fn push(&self, job: T) -> Result<(), T> {
        let mut job = Some(job);
        self.add(|jobs| jobs.extend(job.take())).map_err(|()| job.take().expect("not added"))
    }

    /// Adds jobs with `f` unless the queue is closed, then wakes the consumer
    /// if it sleeps.
    fn add(&self, f: impl FnOnce(&mut Vec<T>)) -> Result<(), ()> {
        let mut q = self.lock();
        if q.closed {
            return Err(());
        }
        f(&mut q.jobs);
        let wake = std::mem::replace(&mut q.sleeping, false);
        drop(q);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Puts `rest` (taken earlier, not run) back at the front of the queue,
    /// before what came meanwhile; leaves `rest` empty.
    pub(super) fn put_back(&self, rest: &mut Vec<T>) {
        if rest.is_empty() {
            return;
        }
        let mut q = self.lock();
        rest.append(&mut q.jobs);
        std::mem::swap(&mut q.jobs, rest);
    }

    /// Whether nothing is queued now.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().jobs.is_empty()
    }

    /// Moves every queued job into `into` (which should be empty), waiting
    /// until there is one, the queue closes, or `deadline` passes.
    pub(super) fn take(&self, into: &mut Vec<T>, deadline: Option<Instant>) -> Taken {
        let mut q = self.lock();
        loop {
            if !q.jobs.is_empty() {
                std::mem::swap(&mut q.jobs, into);
                return Taken::Jobs;
            }
            if q.closed {
                return Taken::Closed;
            }
            q.sleeping = true;
            q = match deadline {
                None => self.wake.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        q.sleeping = false;
                        return Taken::Timeout;
                    }
                    self.wake.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0
                }
            };
            q.sleeping = false;
        }
    }

    /// No job is accepted from now on; the consumer still gets what is queued.
    /// Returns nothing; call [`JobQueue::drain`] to take the rest without waiting.
    pub(super) fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        drop(q);
        self.wake.notify_all();
    }

    /// Closes the queue and takes whatever is still in it.
    pub(super) fn close_and_drain(&self) -> Vec<T> {
        let mut q = self.lock();
        q.closed = true;
        std::mem::take(&mut q.jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn batches_arrive_whole_and_in_order() {
        let q = JobQueue::new();
        let mut batch = vec![1, 2, 3];
        q.push_all(&mut batch).unwrap();
        assert!(batch.is_empty() && batch.capacity() >= 3, "the producer keeps its buffer");
        q.push(4).unwrap();
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, None), Taken::Jobs);
        assert_eq!(got, [1, 2, 3, 4]);
    }

    #[test]
    fn what_is_put_back_comes_before_what_came_meanwhile() {
        let q = JobQueue::new();
        q.push(3).unwrap();
        let mut rest = vec![1, 2];
        q.put_back(&mut rest);
        assert!(rest.is_empty());
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, None), Taken::Jobs);
        assert_eq!(got, [1, 2, 3]);
    }

    #[test]
    fn take_times_out_when_nothing_comes() {
        let q: JobQueue<u32> = JobQueue::new();
        let t = Instant::now();
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, Some(t + Duration::from_millis(30))), Taken::Timeout);
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(got.is_empty());
    }

    #[test]
    fn a_sleeping_consumer_is_woken_by_a_batch() {
        let q = Arc::new(JobQueue::new());
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let mut got = Vec::new();
                while q.take(&mut got, None) == Taken::Jobs {
                    all.append(&mut got);
                }
                all
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        for i in 0..100 {
            let mut b = vec![2 * i, 2 * i + 1];
            q.push_all(&mut b).unwrap();
        }
        q.close();
        let all = consumer.join().unwrap();
        assert_eq!(all, (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn a_closed_queue_refuses_jobs_and_gives_back_the_rest() {
        let q = JobQueue::new();
        q.push(1).unwrap();
        assert_eq!(q.close_and_drain(), [1]);
        assert_eq!(q.push(2), Err(2));
        let mut b = vec![3];
        assert_eq!(q.push_all(&mut b), Err(()));
        assert_eq!(b, [3], "a refused batch stays with the producer");
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, None), Taken::Closed);
    }
}
