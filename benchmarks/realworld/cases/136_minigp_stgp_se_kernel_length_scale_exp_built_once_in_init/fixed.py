# Reproduction of https://github.com/IceLab-X/MiniGP/issues/13 (MiniGP's stgp_demo.py, the spatio-temporal GP demo:
# SE_kernel.__init__ stores self.length_scale = torch.exp(nn.Parameter(...)), a tensor computed once, whose exp graph
# every negative log-likelihood reuses, so the second training epoch backpropagates through the graph the first
# loss.backward() freed (and the wrapped Parameter is never registered); the maintainers made length_scale itself the
# nn.Parameter. The PM2.5 .mat data replaced by random station coordinates and smooth synthetic readings; no plots).
import torch
import torch.nn as nn
JITTER = 1e-1

torch.manual_seed(0)


def kronecker(A, B):
    AB = torch.einsum("ab,cd->acbd", A, B)
    AB = AB.view(A.size(0) * B.size(0), A.size(1) * B.size(1))
    return AB

class SE_kernel(nn.Module):
    def __init__(self, length_scale=1.0):
        super().__init__()
        self.length_scale = nn.Parameter(torch.exp(torch.log(torch.tensor(length_scale))))
    def forward(self, X, X2):
        X = X / self.length_scale.expand(X.size(0), X.size(1))
        X2 = X2 / self.length_scale.expand(X2.size(0), X2.size(1))

        X_norm2 = torch.sum(X * X, dim=1).view(-1, 1)
        X2_norm2 = torch.sum(X2 * X2, dim=1).view(-1, 1)

        # compute effective distance
        K = -2.0 * X @ X2.t() + X_norm2.expand(X.size(0), X2.size(0)) + X2_norm2.t().expand(X.size(0), X2.size(0))
        K = torch.exp(-K) * 1.0
        return K

class stgp(nn.Module):
    def __init__(self, latlong_length_scale=4300., elevation_length_scale=30., time_length_scale=0.25,
                 noise_variance=0.1, signal_variance=1.):
        super(stgp, self).__init__()

        self.log_noise_variance = nn.Parameter(torch.log(torch.tensor(noise_variance)))
        self.log_signal_variance = nn.Parameter(torch.log(torch.tensor(signal_variance)))

        self.latlong_kernel = SE_kernel(latlong_length_scale)
        self.elevation_kernel = SE_kernel(elevation_length_scale)
        self.temporal_kernel = SE_kernel(time_length_scale)

    def negative_log_likelihood(self, space_coordinates, time_coordinates, stData):

        latlong_K = self.latlong_kernel(space_coordinates[:, 0:2], space_coordinates[:, 0:2])
        elevation_K = self.elevation_kernel(space_coordinates[:, 2:3], space_coordinates[:, 2:3])

        spatial_K = latlong_K * elevation_K + torch.eye(latlong_K.size(0)) * JITTER
        temporal_K = self.temporal_kernel(time_coordinates, time_coordinates) + torch.eye(time_coordinates.size(0)) * JITTER

        eigen_value_s, eigen_vector_s = torch.linalg.eigh(spatial_K, UPLO='L')
        eigen_value_t, eigen_vector_t = torch.linalg.eigh(temporal_K, UPLO='L')

        eigen_vector_st = kronecker(eigen_vector_t, eigen_vector_s)
        eigen_value_st = kronecker(eigen_value_t.view(-1, 1), eigen_value_s.view(-1, 1)).view(-1)
        eigen_value_st_plus_noise_inverse = 1. / (eigen_value_st + torch.exp(self.log_noise_variance))

        sigma_inverse = eigen_vector_st @ eigen_value_st_plus_noise_inverse.diag_embed() @ eigen_vector_st.transpose(-2, -1)

        self.sigma_inverse = sigma_inverse.detach().cpu()
        self.alpha = sigma_inverse @ stData.transpose(-2, -1).reshape(-1, 1).detach().cpu()

        nll = 0
        nll += 0.5 * (eigen_value_st + torch.exp(self.log_noise_variance)).log().sum()
        nll += 0.5 * (stData.transpose(-2, -1).reshape(1, -1) @ self.alpha).sum()
        return nll

    def forward(self, train_space_coordinates, train_time_coordinates, test_space_coordinates, test_time_coordinates):

        test_latlong_K = self.latlong_kernel(test_space_coordinates[:, 0:2], train_space_coordinates[:, 0:2])
        test_elevation_K = self.elevation_kernel(test_space_coordinates[:, 2:3], train_space_coordinates[:, 2:3])
        test_spatial_K = test_latlong_K * test_elevation_K
        test_temporal_K = self.temporal_kernel(test_time_coordinates, train_time_coordinates)
        test_st_K = kronecker(test_temporal_K, test_spatial_K)
        yPred = test_st_K @ self.alpha
        yVar = torch.zeros(test_st_K.size(0))
        for i in range(test_st_K.size(0)):
            yVar[i] = self.log_signal_variance.exp() - test_st_K[i:i + 1,:] @ self.sigma_inverse @ test_st_K[i:i + 1, :].t()
        yPred = yPred.view(test_time_coordinates.size(0), test_space_coordinates.size(0)).transpose(-2, -1)
        yVar = yVar.view(test_time_coordinates.size(0), test_space_coordinates.size(0)).transpose(-2, -1)

        return yPred, yVar

def train_stgp(model, train_space_coordinates, train_time_coordinates, train_stData, lr=0.1, epochs=5):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for i in range(epochs):
        optimizer.zero_grad()
        loss = model.negative_log_likelihood(train_space_coordinates, train_time_coordinates, train_stData)
        loss.backward()
        optimizer.step()
        print('Epoch: {}, Loss: {}'.format(i, loss.item()))


if __name__ == '__main__':
    # stand-ins for the .mat arrays: station coordinates (x, y, elevation), times, PM2.5 readings
    time = torch.linspace(0, 1, 5, dtype=torch.float64).view(-1, 1)
    str = torch.rand(8, 3, dtype=torch.float64) * torch.tensor([4000., 4000., 50.], dtype=torch.float64)
    pm25 = torch.sin(str[:, :1] / 1000.) + torch.cos(3 * time.view(1, -1))
    str_daq = torch.rand(3, 3, dtype=torch.float64) * torch.tensor([4000., 4000., 50.], dtype=torch.float64)

    model = stgp()

    train_stgp(model, str, time, pm25, lr=0.1, epochs=5)
    with torch.no_grad():
        yPred, yVar = model(str, time, str_daq, time)
    print(yPred.shape, yVar.shape)
