//! A loader state's layout, checked field by field before any of it is
//! used (`ferroloader.epoch.check`): every field the resume reads, with its
//! type and range. A state damaged, truncated or written by hand is refused
//! with a `ConfigError` naming the first field that is wrong. What the
//! check needs of the loader comes in as plain facts ([`Facts`]).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString};

use super::error::Class;

/// What the layout depends on in the loader it is loaded into.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct Facts {
    /// `None`: the loader is not sharded; else its shards' count.
    shards: Option<u64>,
    /// Bytes of a generator state.
    generator_bytes: usize,
    /// The loader's index sampler is an `ElasticBatchSampler`.
    elastic: bool,
    /// The number of a Mixture's sources, where its sampler is a mixture's.
    mixture: Option<usize>,
}

type Check = Result<(), String>;

fn need(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn field<'py>(d: &Bound<'py, PyDict>, key: &str) -> Option<Bound<'py, PyAny>> {
    d.get_item(key).ok().flatten()
}

/// A non-negative int (not a bool).
fn count(v: Option<&Bound<'_, PyAny>>) -> Option<u64> {
    let v = v?;
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return None;
    }
    v.extract::<u64>().ok()
}

fn counts(v: Option<&Bound<'_, PyAny>>) -> Option<Vec<u64>> {
    let list = v?.cast::<PyList>().ok()?;
    list.iter().map(|x| count(Some(&x))).collect()
}

fn flag(d: &Bound<'_, PyDict>, key: &str) -> bool {
    field(d, key).is_none_or(|v| v.is_instance_of::<PyBool>())
}

fn is_true(d: &Bound<'_, PyDict>, key: &str) -> bool {
    field(d, key).is_some_and(|v| v.is_truthy().unwrap_or(false))
}

fn mapping<'py>(v: Option<Bound<'py, PyAny>>, what: &str) -> Result<Bound<'py, PyDict>, String> {
    v.and_then(|v| v.cast_into::<PyDict>().ok())
        .ok_or_else(|| format!("{what} is not a mapping"))
}

fn generator_text(v: Option<&Bound<'_, PyAny>>, size: usize, what: &str) -> Check {
    let text: String = v
        .filter(|v| v.is_instance_of::<PyString>())
        .and_then(|v| v.extract().ok())
        .ok_or_else(|| format!("{what} is not text"))?;
    let raw = decode_base64(&text).ok_or_else(|| format!("{what} is not base64"))?;
    need(raw == size, || {
        format!("{what} has {raw} bytes, a generator state has {size}")
    })
}

/// The decoded length of strict (padded, RFC 4648) base64 text, or `None`.
fn decode_base64(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let body = &b[..b.len() - pad];
    if !body
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
    {
        return None;
    }
    Some(b.len() / 4 * 3 - pad)
}

fn worker_entry(w: &Bound<'_, PyAny>, i: usize) -> Check {
    let what = format!("epoch.workers[{i}]");
    let w = mapping(Some(w.clone()), &what)?;
    need(count(field(&w, "delivered").as_ref()).is_some(), || {
        format!("{what}.delivered is not a count")
    })?;
    for key in ["exhausted", "done"] {
        need(flag(&w, key), || format!("{what}.{key} is not a bool"))?;
    }
    let state_ok = match field(&w, "state") {
        None => true,
        Some(s) if s.is_none() => true,
        Some(s) => s.cast::<PyDict>().is_ok_and(|d| {
            d.keys().iter().all(|k| {
                k.extract::<String>()
                    .is_ok_and(|k| k == "dataset" || k == "iterator")
            })
        }),
    };
    need(state_ok, || format!("{what}.state is not a replica state"))
}

fn works(v: Option<&Bound<'_, PyAny>>, n_shards: u64, what: &str) -> Check {
    let list = v
        .and_then(|v| v.cast::<PyList>().ok())
        .ok_or_else(|| format!("{what} is not a list"))?;
    for w in list.iter() {
        let w =
            counts(Some(&w)).ok_or_else(|| format!("a work of {what} is not a list of counts"))?;
        need(w.len() == 3, || {
            format!("a work of {what} is not (shard, emitted, end)")
        })?;
        need(w[0] < n_shards, || {
            format!("a work of {what} names shard {} of {n_shards}", w[0])
        })?;
        need(w[2] >= w[1], || {
            format!("a work of {what} ends before it begins")
        })?;
    }
    Ok(())
}

/// One rank's account of an epoch of the job's shared queue (`shared`:
/// the epoch's list, where the state holds it once for every account).
fn account(
    a: &Bound<'_, PyAny>,
    shared: Option<&Bound<'_, PyAny>>,
    n_shards: u64,
    what: &str,
) -> Check {
    let a = mapping(Some(a.clone()), what)?;
    let list = match (field(&a, "list"), shared) {
        (None, Some(l)) => Some(l.clone()),
        (own, _) => {
            works(own.as_ref(), n_shards, &format!("{what}.list"))?;
            own
        }
    };
    need(
        field(&a, "list_id").is_some_and(|v| v.is_instance_of::<PyString>()),
        || format!("{what}.list_id is not text"),
    )?;
    let claimed = counts(field(&a, "claimed").as_ref())
        .ok_or_else(|| format!("{what}.claimed is not a list of counts"))?;
    let len = list.map_or(0, |l| l.len().unwrap_or(0)) as u64;
    need(claimed.iter().all(|&p| p < len), || {
        format!("{what}.claimed names no work of its list")
    })?;
    works(
        field(&a, "rest").as_ref(),
        n_shards,
        &format!("{what}.rest"),
    )?;
    need(count(field(&a, "handed").as_ref()).is_some(), || {
        format!("{what}.handed is not a count")
    })?;
    let budget = field(&a, "budget");
    need(
        budget
            .as_ref()
            .is_none_or(|b| b.is_none() || count(Some(b)).is_some()),
        || format!("{what}.budget is not a count"),
    )?;
    need(flag(&a, "ended"), || format!("{what}.ended is not a bool"))
}

/// A rank's account, or every rank's (`merged`: a state saved on several
/// ranks, or `merge_states`; the epoch's list held once, or in each).
fn world(sh: &Bound<'_, PyAny>, n_shards: u64, what: &str) -> Check {
    let d = mapping(Some(sh.clone()), what)?;
    if is_true(&d, "merged") {
        let accounts = field(&d, "accounts")
            .and_then(|a| a.cast_into::<PyList>().ok())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("{what}.accounts is not a list"))?;
        let list = field(&d, "list");
        if list.is_some() {
            works(list.as_ref(), n_shards, &format!("{what}.list"))?;
        }
        for (i, a) in accounts.iter().enumerate() {
            account(
                &a,
                list.as_ref(),
                n_shards,
                &format!("{what}.accounts[{i}]"),
            )?;
        }
        return Ok(());
    }
    account(sh, None, n_shards, what)
}

fn shards(sh: &Bound<'_, PyAny>, n_shards: u64) -> Check {
    let d = mapping(Some(sh.clone()), "epoch.shards")?;
    if field(&d, "across").is_some_and(|a| a.extract::<String>().is_ok_and(|a| a == "world")) {
        return world(sh, n_shards, "epoch.shards");
    }
    need(
        field(&d, "mode").is_some_and(|m| m.is_instance_of::<PyString>()),
        || "epoch.shards.mode is not text".into(),
    )?;
    for key in ["rank", "world"] {
        let v = field(&d, key);
        need(v.is_none() || count(v.as_ref()).is_some(), || {
            format!("epoch.shards.{key} is not a count")
        })?;
    }
    if let Some(consumed) = field(&d, "consumed") {
        return need(count(Some(&consumed)).is_some(), || {
            "epoch.shards.consumed is not a count".into()
        });
    }
    let next_lane = count(field(&d, "next_lane").as_ref())
        .ok_or_else(|| "epoch.shards.next_lane is not a count".to_string())?;
    need(count(field(&d, "handed").as_ref()).is_some(), || {
        "epoch.shards.handed is not a count".into()
    })?;
    let positions = field(&d, "positions")
        .and_then(|p| p.cast_into::<PyList>().ok())
        .ok_or_else(|| "epoch.shards.positions is not a list".to_string())?;
    need(next_lane < positions.len().max(1) as u64, || {
        "epoch.shards.next_lane names no lane".into()
    })?;
    for p in positions.iter() {
        if p.is_none() {
            continue;
        }
        // (begun works, shard, items emitted from it)
        let p = counts(Some(&p))
            .ok_or_else(|| "a lane position is not a list of counts".to_string())?;
        need(p.len() == 3, || {
            "a lane position is not (started, shard, emitted)".into()
        })?;
        need(p[1] < n_shards, || {
            format!("a lane position names shard {} of {n_shards}", p[1])
        })?;
    }
    let rest = field(&d, "rest");
    if let Some(rest) = rest.filter(|r| !r.is_none()) {
        let rest = rest
            .cast_into::<PyList>()
            .map_err(|_| "epoch.shards.rest is not a list".to_string())?;
        for w in rest.iter() {
            // (shard, items emitted from it[, where its part ends]): a
            // dynamic lane's batches not handed over end before their shard
            let w = counts(Some(&w))
                .ok_or_else(|| "a queued shard is not a list of counts".to_string())?;
            need(w.len() == 2 || w.len() == 3, || {
                "a queued shard is not (shard, emitted[, end])".into()
            })?;
            need(w[0] < n_shards, || {
                format!("a queued shard names shard {} of {n_shards}", w[0])
            })?;
            need(w.len() == 2 || w[2] >= w[1], || {
                "a queued shard ends before it begins".into()
            })?;
        }
    }
    Ok(())
}

fn segments(segments: &Bound<'_, PyAny>, facts: &Facts) -> Check {
    let n = facts
        .mixture
        .ok_or_else(|| "the state is of a Mixture, this loader's is not".to_string())?;
    let list = segments
        .cast::<PyList>()
        .ok()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| "epoch.elastic_sampler.mixture is not a list".to_string())?;
    let mut last: Option<u64> = None;
    let mut first = None;
    for seg in list.iter() {
        let pair = seg.cast::<PyList>().ok().filter(|p| p.len() == 2);
        let start = pair
            .as_ref()
            .and_then(|p| count(p.get_item(0).ok().as_ref()));
        let weights_ok = pair
            .as_ref()
            .and_then(|p| p.get_item(1).ok())
            .is_some_and(|w| {
                w.cast::<PyList>().is_ok_and(|w| {
                    w.len() == n
                        && w.iter().all(|x| {
                            !x.is_instance_of::<PyBool>()
                                && x.extract::<f64>().is_ok_and(|v| v >= 0.0)
                        })
                })
            });
        let ok = start.is_some_and(|s| last.is_none_or(|l| s > l)) && weights_ok;
        need(ok, || {
            format!("epoch.elastic_sampler.mixture is not [start, {n} weights] segments")
        })?;
        last = start;
        first = first.or(start);
    }
    need(first == Some(0), || {
        "epoch.elastic_sampler.mixture does not start at 0".into()
    })
}

fn epoch(e: &Bound<'_, PyAny>, gens: usize, size: usize, workers: u64, facts: &Facts) -> Check {
    let d = mapping(Some(e.clone()), "epoch")?;
    for key in ["generators_at_start", "generators_at_first_draw"] {
        if key == "generators_at_start" || field(&d, key).is_some() {
            let states = field(&d, key)
                .and_then(|s| s.cast_into::<PyList>().ok())
                .filter(|s| s.len() == gens)
                .ok_or_else(|| format!("epoch.{key} does not list every generator"))?;
            for (i, g) in states.iter().enumerate() {
                generator_text(Some(&g), size, &format!("epoch.{key}[{i}]"))?;
            }
        }
    }
    if let Some(sh) = field(&d, "shards") {
        let n = facts.shards.ok_or_else(|| {
            "the state is of a sharded epoch, this loader is not sharded".to_string()
        })?;
        return shards(&sh, n);
    }
    need(facts.shards.is_none(), || {
        "this loader is sharded, the state's epoch is not".into()
    })?;
    let drawn = count(field(&d, "drawn").as_ref())
        .ok_or_else(|| "epoch.drawn is not a count".to_string())?;
    let pending = counts(field(&d, "pending").as_ref())
        .ok_or_else(|| "epoch.pending is not a list of counts".to_string())?;
    need(
        pending.windows(2).all(|p| p[0] < p[1]) && pending.iter().all(|&p| p < drawn),
        || "epoch.pending is not a sorted set of batches drawn".into(),
    )?;
    need(flag(&d, "exhausted"), || {
        "epoch.exhausted is not a bool".into()
    })?;
    need(flag(&d, "reset"), || "epoch.reset is not a bool".into())?;
    if is_true(&d, "reset") {
        need(count(field(&d, "base_seed").as_ref()).is_some(), || {
            "epoch.base_seed is not a seed".into()
        })?;
    }
    if let Some(ws) = field(&d, "workers") {
        let ws = ws
            .cast_into::<PyList>()
            .ok()
            .filter(|w| w.len() as u64 == workers)
            .ok_or_else(|| "epoch.workers is not one per worker".to_string())?;
        for (i, w) in ws.iter().enumerate() {
            worker_entry(&w, i)?;
        }
        need(
            count(field(&d, "next_worker").as_ref()).is_some_and(|n| n < workers.max(1)),
            || "epoch.next_worker is not a worker".into(),
        )?;
    }
    if let Some(e) = field(&d, "elastic_sampler") {
        let ok = e.cast::<PyDict>().is_ok_and(|e| {
            count(field(e, "epoch").as_ref()).is_some()
                && count(field(e, "consumed").as_ref()).is_some()
        });
        need(ok, || {
            "epoch.elastic_sampler is not (epoch, consumed)".into()
        })?;
        need(facts.elastic, || {
            "the state is of an ElasticBatchSampler, this loader has none".into()
        })?;
        if let Some(m) = e.cast::<PyDict>().ok().and_then(|e| field(e, "mixture")) {
            segments(&m, facts)?;
        }
    }
    if let Some(pb) = field(&d, "pending_batches") {
        need(
            pb.cast::<PyList>()
                .is_ok_and(|pb| pb.len() == pending.len()),
            || "epoch.pending_batches does not match epoch.pending".into(),
        )?;
    }
    Ok(())
}

fn layout(state: &Bound<'_, PyDict>, facts: &Facts) -> Check {
    need(
        field(state, "fingerprint").is_some_and(|f| f.is_instance_of::<PyDict>()),
        || "fingerprint is not a mapping".into(),
    )?;
    need(
        count(field(state, "epochs_started").as_ref()).is_some(),
        || "epochs_started is not a count".into(),
    )?;
    let workers = count(field(state, "num_workers").as_ref())
        .ok_or_else(|| "num_workers is not a count".to_string())?;
    let gens = field(state, "generators")
        .and_then(|g| g.cast_into::<PyList>().ok())
        .ok_or_else(|| "generators is not a list".to_string())?;
    let size = facts.generator_bytes;
    for (i, g) in gens.iter().enumerate() {
        let g = mapping(Some(g), &format!("generators[{i}]"))?;
        let roles_ok = field(&g, "roles").is_some_and(|r| {
            r.cast::<PyList>()
                .is_ok_and(|r| r.iter().all(|x| x.is_instance_of::<PyString>()))
        });
        need(roles_ok, || {
            format!("generators[{i}].roles is not a list of names")
        })?;
        generator_text(
            field(&g, "state").as_ref(),
            size,
            &format!("generators[{i}].state"),
        )?;
    }
    let base = field(state, "base_seed");
    need(base.is_none() || count(base.as_ref()).is_some(), || {
        "base_seed is not a seed".into()
    })?;
    if let Some(ws) = field(state, "worker_states") {
        let ws = ws
            .cast_into::<PyList>()
            .ok()
            .filter(|w| w.len() as u64 == workers)
            .ok_or_else(|| "worker_states is not one per worker".to_string())?;
        for (i, w) in ws.iter().enumerate() {
            let entry = PyDict::new(state.py());
            entry
                .set_item("delivered", 0)
                .and_then(|_| entry.set_item("state", w))
                .map_err(|e| e.to_string())?;
            worker_entry(entry.as_any(), i)?;
        }
    }
    if let Some(carry) = field(state, "world_carry") {
        world(&carry, facts.shards.unwrap_or(0), "world_carry")?;
    }
    let e = field(state, "epoch").ok_or_else(|| "the state has no epoch".to_string())?;
    if !e.is_none() {
        epoch(&e, gens.len(), size, workers, facts)?;
    }
    Ok(())
}

/// Checks `state`'s layout for a loader of these `facts`: a `ConfigError`
/// naming the first field that is wrong.
#[pyfunction]
pub fn check_state_layout(state: &Bound<'_, PyDict>, facts: Facts) -> PyResult<()> {
    layout(state, &facts)
        .map_err(|e| Class::Config.err(format!("load_state_dict(): the state is malformed: {e}")))
}

/// A sharded epoch's loaded position (`resume`: the state's `shards`)
/// against the loader that resumes it: saved across the same ranks' queue
/// (`across`), in the same `mode`, and (static, dynamic) by this `rank` of
/// as many (`world`); a `ConfigError` saying which differs. Every rank's
/// merged state of the job's queue resumes on any number of ranks.
#[pyfunction]
pub fn check_shard_resume(
    resume: &Bound<'_, PyDict>,
    across: &str,
    mode: &str,
    world: i64,
    rank: i64,
) -> PyResult<()> {
    let head = "iter(): the state given to load_state_dict() was saved";
    let fail = |msg: String| Err(Class::Config.err(msg));
    let py = resume.py();
    let text = |key: &str| -> PyResult<String> {
        let v = field(resume, key).unwrap_or_else(|| py.None().into_bound(py));
        Ok(v.repr()?.to_string())
    };
    let saved_across = match field(resume, "across") {
        Some(a) => a.extract::<String>().ok(),
        None => Some("rank".to_string()),
    };
    if saved_across.as_deref() != Some(across) {
        let saved = match field(resume, "across") {
            Some(_) => text("across")?,
            None => "'rank'".to_string(),
        };
        return fail(format!(
            "{head} with Sharding(across={saved}), this loader shards across='{across}'"
        ));
    }
    let merged = match field(resume, "merged") {
        Some(m) => m.is_truthy()?,
        None => false,
    };
    if across == "world" && merged {
        return Ok(()); // every rank's state: it resumes on any number of ranks
    }
    let saved_mode = field(resume, "mode").and_then(|m| m.extract::<String>().ok());
    if saved_mode.as_deref() != Some(mode) {
        let saved = text("mode")?;
        return fail(format!(
            "{head} with {saved} sharding, this loader shards '{mode}'"
        ));
    }
    if mode == "elastic" {
        return Ok(());
    }
    let number = |key: &str| -> PyResult<(Option<i64>, String)> {
        let v = resume
            .get_item(key)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(key.to_string()))?;
        Ok((v.extract::<i64>().ok(), v.str()?.to_string()))
    };
    let (saved_world, shown) = number("world")?;
    if saved_world != Some(world) {
        return fail(format!(
            "{head} with world_size {shown}, this process has {world}; {mode} sharding resumes \
             on the same number of ranks (elastic sharding resumes on any, and so does \
             across='world' from every rank's state: ferroloader.merge_states)"
        ));
    }
    let (saved_rank, shown) = number("rank")?;
    if saved_rank != Some(rank) {
        return fail(format!(
            "iter(): the state given to load_state_dict() was saved by rank {shown}, this \
             process is rank {rank}; {mode} sharding keeps a state per rank (save each rank's \
             state_dict())"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64_lengths() {
        assert_eq!(decode_base64(""), Some(0));
        assert_eq!(decode_base64("QUJD"), Some(3));
        assert_eq!(decode_base64("QUI="), Some(2));
        assert_eq!(decode_base64("QQ=="), Some(1));
        assert_eq!(decode_base64("QQ="), None);
        assert_eq!(decode_base64("Q!=="), None);
        assert_eq!(decode_base64("Q==="), None);
    }
}
