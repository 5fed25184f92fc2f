//! Seeded, name-addressed parameter storage.
//!
//! [`ParamStore`] is a candle `VarMap` whose initial values come from a generator seeded by
//! `(seed, parameter name)`, so the same seed gives the same weights whatever the order in which
//! modules are built or the number of threads. Models and objectives create their tensors through
//! the `VarBuilder` it hands out; names are PyTorch-style state-dict keys (`encoder.conv1.weight`).

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Named variables with seeded initialisation.
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<Inner>,
}

struct Inner {
    vars: VarMap,
    seed: u64,
}

/// Suffixes of state-dict keys that are buffers (updated by forward passes or hooks, never by
/// the optimiser, not averaged into an EMA teacher).
const BUFFER_SUFFIXES: &[&str] = &["running_mean", "running_var", "num_batches_tracked"];

impl ParamStore {
    /// An empty store whose initial values derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                vars: VarMap::new(),
                seed,
            }),
        }
    }

    /// A `VarBuilder` (f32) creating and reading variables in this store.
    pub fn var_builder(&self, device: &Device) -> VarBuilder<'static> {
        self.builder(device, false)
    }

    /// A `VarBuilder` (f32) over the same variables whose parameters it hands out detached:
    /// views of the variables' storage, so an EMA step or a checkpoint load that sets the
    /// variables in place updates them, but a forward pass through them records nothing for
    /// backward (PyTorch's `no_grad` EMA teacher: no graph kept alive while it runs, no
    /// gradients computed for it). Buffers (batch-norm running statistics) stay variables, as
    /// the batch norm sets them in place through its own handle.
    pub fn frozen_var_builder(&self, device: &Device) -> VarBuilder<'static> {
        self.builder(device, true)
    }

    fn builder(&self, device: &Device, frozen: bool) -> VarBuilder<'static> {
        VarBuilder::from_backend(
            Box::new(StoreInit {
                store: self.clone(),
                frozen,
            }),
            DType::F32,
            device.clone(),
        )
    }

    /// Every variable, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        let map = self
            .inner
            .vars
            .data()
            .lock()
            .expect("parameter store lock poisoned");
        let mut all: Vec<_> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Variables whose name starts with `prefix`, sorted by name.
    pub fn vars_with_prefix(&self, prefix: &str) -> Vec<(String, Var)> {
        self.vars()
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect()
    }

    /// Whether `name` is a buffer rather than a trainable parameter.
    pub fn is_buffer(name: &str) -> bool {
        BUFFER_SUFFIXES.iter().any(|s| name.ends_with(s))
    }

    /// The current values, for saving.
    pub fn tensors(&self) -> HashMap<String, Tensor> {
        self.vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().clone()))
            .collect()
    }

    /// Overwrites variables from `tensors`; every variable of the store must be present with
    /// the same shape. Returns the names in `tensors` the store does not have.
    pub fn load(&self, tensors: &HashMap<String, Tensor>) -> anyhow::Result<Vec<String>> {
        let vars = self.vars();
        for (name, var) in &vars {
            let Some(t) = tensors.get(name) else {
                anyhow::bail!(
                    "checkpoint lacks `{name}`; it was written by a different model or objective"
                );
            };
            if t.shape() != var.shape() {
                anyhow::bail!(
                    "checkpoint tensor `{name}` has shape {:?}, the model expects {:?}",
                    t.dims(),
                    var.dims()
                );
            }
            var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        let mut extra: Vec<String> = tensors
            .keys()
            .filter(|k| !vars.iter().any(|(n, _)| n == *k))
            .cloned()
            .collect();
        extra.sort();
        Ok(extra)
    }

    fn init_values(&self, name: &str, shape: &Shape, init: Init) -> Vec<f32> {
        let n = shape.elem_count();
        if let Init::Const(c) = init {
            return vec![c as f32; n];
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.inner.seed ^ fnv1a(name.as_bytes()));
        let (normal, mean, scale) = match init {
            Init::Const(_) => unreachable!("handled above"),
            Init::Randn { mean, stdev } => (true, mean, stdev),
            Init::Uniform { lo, up } => (false, (lo + up) / 2.0, (up - lo) / 2.0),
            Init::Kaiming {
                dist,
                fan,
                non_linearity,
            } => {
                let dims = shape.dims();
                let receptive: usize = dims.iter().skip(2).product();
                let fan_value = match fan {
                    FanInOut::FanIn => dims.get(1).copied().unwrap_or(1) * receptive,
                    FanInOut::FanOut => dims.first().copied().unwrap_or(1) * receptive,
                } as f64;
                let gain = match non_linearity {
                    NonLinearity::ReLU => 2f64.sqrt(),
                    NonLinearity::Tanh => 5.0 / 3.0,
                    NonLinearity::Linear | NonLinearity::Sigmoid => 1.0,
                    NonLinearity::SELU => 0.75,
                    NonLinearity::ExplicitGain(g) => g,
                };
                let std = gain / fan_value.max(1.0).sqrt();
                match dist {
                    NormalOrUniform::Normal => (true, 0.0, std),
                    NormalOrUniform::Uniform => (false, 0.0, 3f64.sqrt() * std),
                }
            }
        };
        (0..n)
            .map(|_| {
                let u: f64 = if normal {
                    StandardNormal.sample(&mut rng)
                } else {
                    rng.random_range(-1.0..1.0)
                };
                (mean + scale * u) as f32
            })
            .collect()
    }
}

/// The `VarBuilder` backend of a [`ParamStore`]; `frozen`: parameters are handed out detached
/// ([`ParamStore::frozen_var_builder`]).
pub struct StoreInit {
    store: ParamStore,
    frozen: bool,
}

impl StoreInit {
    fn hand_out(&self, name: &str, var: &Var) -> Tensor {
        match self.frozen && !ParamStore::is_buffer(name) {
            true => var.as_tensor().detach(),
            false => var.as_tensor().clone(),
        }
    }
}

impl SimpleBackend for StoreInit {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let store = &self.store.inner;
        let mut map = store
            .vars
            .data()
            .lock()
            .expect("parameter store lock poisoned");
        if let Some(var) = map.get(name) {
            if var.shape() != &s {
                candle_core::bail!(
                    "parameter `{name}` exists with shape {:?}, requested {:?}",
                    var.dims(),
                    s.dims()
                );
            }
            return Ok(self.hand_out(name, var));
        }
        let values = self.store.init_values(name, &s, h);
        let var = Var::from_tensor(&Tensor::from_vec(values, s, dev)?.to_dtype(dtype)?)?;
        let t = self.hand_out(name, &var);
        map.insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        let map = self
            .store
            .inner
            .vars
            .data()
            .lock()
            .expect("parameter store lock poisoned");
        match map.get(name) {
            Some(v) => Ok(self.hand_out(name, v)),
            None => candle_core::bail!("no parameter named `{name}`"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        let map = self
            .store
            .inner
            .vars
            .data()
            .lock()
            .expect("parameter store lock poisoned");
        map.contains_key(name)
    }
}

/// 64-bit FNV-1a, a stable hash of parameter names (std's hasher is not stable across builds).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_weights_regardless_of_creation_order() -> Result<()> {
        let dev = Device::Cpu;
        let a = ParamStore::new(7);
        let b = ParamStore::new(7);
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        };
        let va = a.var_builder(&dev);
        let x1 = va.get_with_hints((3, 4), "x", init)?;
        let y1 = va.get_with_hints(5, "y", init)?;
        let vb = b.var_builder(&dev);
        let y2 = vb.get_with_hints(5, "y", init)?;
        let x2 = vb.get_with_hints((3, 4), "x", init)?;
        assert_eq!(x1.to_vec2::<f32>()?, x2.to_vec2::<f32>()?);
        assert_eq!(y1.to_vec1::<f32>()?, y2.to_vec1::<f32>()?);
        let c = ParamStore::new(8)
            .var_builder(&dev)
            .get_with_hints((3, 4), "x", init)?;
        assert_ne!(x1.to_vec2::<f32>()?, c.to_vec2::<f32>()?);
        Ok(())
    }

    #[test]
    fn frozen_parameters_follow_their_variables_and_take_no_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let store = ParamStore::new(3);
        let frozen = store.frozen_var_builder(&dev);
        let w = frozen.get_with_hints(3, "teacher.w", Init::Const(1.0))?;
        let running = frozen.get_with_hints(3, "teacher.bn.running_mean", Init::Const(0.0))?;
        assert!(!w.is_variable() && running.is_variable());
        // A forward pass through frozen parameters records no graph; through live ones it does.
        let input = Tensor::new(&[1f32, 2., 3.], &dev)?;
        let live = store
            .var_builder(&dev)
            .get_with_hints(3, "w", Init::Const(2.0))?;
        assert!(!w.mul(&input)?.sum_all()?.track_op());
        assert!(live.mul(&input)?.sum_all()?.track_op());
        // An EMA step or a checkpoint load sets the variable in place: the frozen view sees it.
        let vars = store.vars_with_prefix("teacher.w");
        vars[0].1.set(&Tensor::new(&[5f32, 6., 7.], &dev)?)?;
        assert_eq!(w.to_vec1::<f32>()?, [5., 6., 7.]);
        // The same name read again through either builder is the same variable.
        let again = store
            .var_builder(&dev)
            .get_with_hints(3, "teacher.w", Init::Const(0.0))?;
        assert!(again.is_variable() && again.to_vec1::<f32>()? == [5., 6., 7.]);
        Ok(())
    }

    #[test]
    fn kaiming_uniform_bound_matches_pytorch_linear_default() -> Result<()> {
        // PyTorch Linear: kaiming_uniform(a=√5) → bound = 1/√fan_in.
        let t = ParamStore::new(1)
            .var_builder(&Device::Cpu)
            .get_with_hints(
                (64, 100),
                "w",
                Init::Kaiming {
                    dist: NormalOrUniform::Uniform,
                    fan: FanInOut::FanIn,
                    non_linearity: NonLinearity::ExplicitGain((1.0f64 / 3.0).sqrt()),
                },
            )?;
        let max = t.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(max <= 0.1 + 1e-6 && max > 0.09, "max |w| = {max}");
        Ok(())
    }

    #[test]
    fn load_round_trips_and_rejects_wrong_shapes() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let a = ParamStore::new(1);
        a.var_builder(&dev)
            .get_with_hints(3, "w", Init::Const(2.0))?;
        let b = ParamStore::new(2);
        b.var_builder(&dev)
            .get_with_hints(3, "w", Init::Const(0.0))?;
        let extra = b.load(&a.tensors())?;
        assert!(extra.is_empty());
        assert_eq!(b.tensors()["w"].to_vec1::<f32>()?, vec![2.0; 3]);
        let c = ParamStore::new(3);
        c.var_builder(&dev)
            .get_with_hints(4, "w", Init::Const(0.0))?;
        let err = c.load(&a.tensors()).unwrap_err().to_string();
        assert!(err.contains("shape"), "{err}");
        Ok(())
    }
}
