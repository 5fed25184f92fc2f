//! The step's image tensors, made on the data loader's thread
//! ([`ssl_data::ViewLoader::prefetch_with`]) so that a batch's upload overlaps the steps before
//! it. On the CPU the views become a tensor without a copy. On CUDA they are copied into
//! page-locked host memory and from there to the GPU on the loader thread's stream (Candle issues
//! a thread's work on that thread's default stream); the training thread's stream waits for an
//! event recorded after the copy before the step reads them. So the training thread neither
//! copies nor waits, where a copy from pageable memory of a large batch blocks it until its
//! stream has reached the copy (77 MB a batch for `train_step` row 3's 2 × 64 views at 224 px).
//! Other devices upload as Candle does, on the loader's thread.

use anyhow::Result;
use candle_core::{Device, Tensor};
use ssl_data::ViewBatch;

/// Makes the image tensors of each batch on `device`.
pub struct Stager {
    device: Device,
    /// One sample's shape.
    sample_shape: Vec<usize>,
    #[cfg(feature = "cuda")]
    pinned: cuda::PinnedBuffers,
}

/// A batch of views with its image tensors made (the batch's `views` and `local_views` moved
/// into them).
pub struct StagedBatch {
    pub batch: ViewBatch,
    images: Tensor,
    local_images: Option<Tensor>,
    /// Recorded on the loader thread's stream after the upload.
    #[cfg(feature = "cuda")]
    uploaded: Option<candle_core::cuda_backend::cudarc::driver::CudaEvent>,
}

impl Stager {
    pub fn new(device: &Device, sample_shape: &[usize]) -> Self {
        Self {
            device: device.clone(),
            sample_shape: sample_shape.to_vec(),
            #[cfg(feature = "cuda")]
            pinned: cuda::PinnedBuffers::default(),
        }
    }

    /// `batch`'s global views as `[V·B, sample...]` and its local views as `[M·B, local...]`
    /// on the device.
    pub fn stage(&mut self, mut batch: ViewBatch) -> Result<StagedBatch> {
        let rows = |count: usize, shape: &[usize]| [&[count * batch.batch_size], shape].concat();
        let images = (
            std::mem::take(&mut batch.views),
            rows(batch.views_count, &self.sample_shape),
        );
        let local = (batch.local_count > 0).then(|| {
            let values = std::mem::take(&mut batch.local_views);
            (values, rows(batch.local_count, &batch.local_shape))
        });
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = &self.device {
            let (images, local_images, uploaded) = self.pinned.upload(dev, images, local)?;
            return Ok(StagedBatch {
                batch,
                images,
                local_images,
                uploaded: Some(uploaded),
            });
        }
        let tensor =
            |(values, shape): (Vec<f32>, Vec<usize>)| Tensor::from_vec(values, shape, &self.device);
        Ok(StagedBatch {
            images: tensor(images)?,
            local_images: local.map(tensor).transpose()?,
            batch,
            #[cfg(feature = "cuda")]
            uploaded: None,
        })
    }
}

impl StagedBatch {
    /// The global and local image tensors, the calling thread's device work ordered after
    /// their upload.
    pub fn tensors(&self) -> Result<(Tensor, Option<Tensor>)> {
        self.after_upload()?;
        Ok((self.images.clone(), self.local_images.clone()))
    }

    /// Makes the calling thread's stream wait for the upload (on CUDA; elsewhere nothing).
    fn after_upload(&self) -> candle_core::Result<()> {
        #[cfg(feature = "cuda")]
        if let (Some(event), Device::Cuda(dev)) = (&self.uploaded, self.images.device()) {
            dev.cuda_stream()
                .wait(event)
                .map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    }
}

impl Drop for StagedBatch {
    /// A batch dropped unread (an epoch stopped early) frees its device memory on the dropping
    /// thread's stream, after its upload, not while the copy may still write it.
    fn drop(&mut self) {
        let _ = self.after_upload();
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::collections::{HashMap, VecDeque};

    use anyhow::{Context, Result};
    use candle_core::cuda_backend::cudarc::driver::{CudaEvent, PinnedHostSlice};
    use candle_core::cuda_backend::{CudaDevice, CudaStorage};
    use candle_core::op::BackpropOp;
    use candle_core::{Storage, Tensor};

    /// Page-locked buffers kept per length, in turn: a buffer is written again only once the
    /// copy from it two batches before is done (its event, which cudarc waits for).
    const IN_TURN: usize = 2;

    #[derive(Default)]
    pub(super) struct PinnedBuffers(HashMap<usize, VecDeque<PinnedHostSlice<f32>>>);

    impl PinnedBuffers {
        /// Uploads `images` and `local` (values and shape) through page-locked buffers on the
        /// calling thread's stream, and records an event after both copies.
        pub(super) fn upload(
            &mut self,
            dev: &CudaDevice,
            images: (Vec<f32>, Vec<usize>),
            local: Option<(Vec<f32>, Vec<usize>)>,
        ) -> Result<(Tensor, Option<Tensor>, CudaEvent)> {
            let images = self.copy(dev, images)?;
            let local = local.map(|l| self.copy(dev, l)).transpose()?;
            let uploaded = dev
                .cuda_stream()
                .record_event(None)
                .context("cannot record the batch's upload on the GPU")?;
            Ok((images, local, uploaded))
        }

        fn copy(
            &mut self,
            dev: &CudaDevice,
            (values, shape): (Vec<f32>, Vec<usize>),
        ) -> Result<Tensor> {
            let stream = dev.cuda_stream();
            let n = values.len();
            let turn = self.0.entry(n).or_default();
            let mut pinned = match turn.len() >= IN_TURN {
                true => turn.pop_front().expect("buffers in turn"),
                // SAFETY: written in full below before any read.
                false => unsafe { stream.context().alloc_pinned::<f32>(n) }.with_context(|| {
                    format!("cannot allocate {} MB of page-locked memory", (n * 4) >> 20)
                })?,
            };
            pinned
                .as_mut_slice()
                .context("cannot reuse a page-locked buffer")?
                .copy_from_slice(&values);
            // SAFETY: the copy below writes all `n` values before anything reads them.
            let mut slice = unsafe { stream.alloc::<f32>(n) }
                .with_context(|| format!("cannot allocate a batch of {n} values on the GPU"))?;
            stream
                .memcpy_htod(&pinned, &mut slice)
                .context("cannot copy a batch to the GPU")?;
            turn.push_back(pinned);
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
            Ok(Tensor::from_storage(
                storage,
                shape,
                BackpropOp::none(),
                false,
            ))
        }
    }
}
